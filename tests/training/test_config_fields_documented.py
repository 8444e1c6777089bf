"""Every field of the job config has its docstring, as README.md promises ("The schema, with a
docstring per field, is in training/config_sections.py and training/config.py"): read from the
source, since a dataclass field's docstring (the string after it) exists only there."""
from __future__ import annotations

import ast
from pathlib import Path

TRAINING = Path(__file__).resolve().parents[2] / "training"
CONFIGS = (TRAINING / "config_sections.py", TRAINING / "config.py")


def undocumented_fields(source: str) -> list[str]:
    """``Class.field`` of every dataclass field not followed by a string literal."""
    missing = []
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef) or not any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
            continue
        for node, after in zip(cls.body, [*cls.body[1:], None]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                documented = (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                              and isinstance(after.value.value, str) and after.value.value.strip())
                if not documented:
                    missing.append(f"{cls.name}.{node.target.id}")
    return missing


def test_every_job_config_field_has_a_docstring():
    for config in CONFIGS:
        assert undocumented_fields(config.read_text()) == [], config


def test_a_field_without_one_is_named():
    source = '@dataclass\nclass TrainConfig:\n    lr: float = 1e-5\n    seed: int = 0\n    """Seed."""\n'
    assert undocumented_fields(source) == ["TrainConfig.lr"]
