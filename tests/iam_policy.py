"""An IAM policy evaluator for identity-based policies within one account: the oracle the
isolation tests ask "may this pod identity do that?" over the SYNTHESIZED policies.

Ported from the rules the AWS IAM User Guide states (no AWS account here, so no policy
simulator); each rule names its page:

- "Policy evaluation logic" / "Determining whether a request is allowed or denied within an
  account": an explicit Deny in any applicable statement wins; otherwise an Allow is needed;
  otherwise the request is implicitly denied. (No permissions boundary, SCP or session policy
  applies to these roles: EKS Pod Identity passes none.)
- "IAM JSON policy elements: Action": action names are case-insensitive; ``*`` and ``?``
  wildcards; ``NotAction`` matches every action not listed.
- "IAM JSON policy elements: Resource": ARNs match with ``*`` (any run of characters, ``/``
  included) and ``?`` (one character), case-sensitively; ``NotResource`` likewise inverted.
- "IAM policy elements: Variables and tags": ``${key}`` is replaced by the request context's
  value before matching; ``${*}``, ``${?}``, ``${$}`` are the literal characters; ``${key, 'default'}``
  uses the default when the key is absent; a variable whose key is absent (and has no default)
  makes that resource or condition value match nothing.
- "IAM JSON policy elements: Condition operators" and "Creating a condition with multiple keys
  or values": every operator of a Condition block and every key under it must hold (AND); any
  one of a key's values suffices (OR); ``StringLike``/``ArnLike`` use the wildcards above (ARN
  matching per colon-separated field is equivalent for the ARNs tested here); the ``...IfExists``
  forms hold when the key is absent; a negated operator (``StringNotEquals``, ``StringNotLike``,
  ``ArnNotEquals``, ``ArnNotLike``) holds when the key is absent; a positive one does not.
  Set operators (``ForAnyValue``/``ForAllValues``) are not ported: the policies here use none, and
  meeting one raises.

CloudFormation intrinsic values are resolved as deployed for ``Ref`` of ``AWS::Partition``,
``AWS::AccountId``, ``AWS::Region`` and ``Fn::Join``; any other token raises.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

PARTITION, ACCOUNT, REGION = "aws", "123456789012", "us-east-1"


UNRESOLVED = "<unresolved>"
"""What a token of another resource becomes with ``strict=False``: a text no ARN matches."""


def resolve(value: Any, *, account: str = ACCOUNT, region: str = REGION, strict: bool = True) -> Any:
    """A CloudFormation value as the deployed text (strings, lists and dicts walked). A token of
    another resource (``Fn::GetAtt``, a ``Ref`` of a resource) raises, or with ``strict=False``
    becomes :data:`UNRESOLVED`."""
    again = lambda v: resolve(v, account=account, region=region, strict=strict)  # noqa: E731
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return [again(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {"Fn::Join"}:
            sep, parts = value["Fn::Join"]
            return sep.join(again(p) for p in parts)
        if set(value) == {"Ref"} and value["Ref"].startswith("AWS::"):
            return {"AWS::Partition": PARTITION, "AWS::AccountId": account, "AWS::Region": region}[value["Ref"]]
        if any(k.startswith(("Fn::", "Ref")) for k in value):
            if strict:
                raise ValueError(f"cannot resolve {value}")
            return UNRESOLVED
        return {k: again(v) for k, v in value.items()}
    return value


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def wildcard(pattern: str, text: str, *, ignore_case: bool = False) -> bool:
    """IAM's ``*`` / ``?`` matching (no other character is special)."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, text, re.DOTALL | (re.IGNORECASE if ignore_case else 0)) is not None


_VARIABLE = re.compile(r"\$\{([^}]*)\}")
_LITERAL = {"*": "\0STAR\0", "?": "\0QMARK\0", "$": "$"}


def substitute(text: str, context: dict[str, str]) -> str | None:
    """``text`` with its policy variables replaced from ``context`` (None: a key is absent).
    The escapes ``${*}``/``${?}`` become markers that :func:`_match_value` treats as literals."""
    missing = False

    def one(match: re.Match) -> str:
        nonlocal missing
        body = match.group(1)
        if body in _LITERAL:
            return _LITERAL[body]
        key, _, default = (part.strip() for part in body.partition(","))
        if key in context:
            return str(context[key])
        if default:
            return default.strip("'")
        missing = True
        return ""

    out = _VARIABLE.sub(one, text)
    return None if missing else out


def _match_value(pattern: str | None, text: str, *, like: bool, ignore_case: bool = False) -> bool:
    if pattern is None:  # a variable with no value in the request: matches nothing
        return False
    if not like:
        pattern = pattern.replace(_LITERAL["*"], "*").replace(_LITERAL["?"], "?")
        return pattern.lower() == text.lower() if ignore_case else pattern == text
    parts = re.split("(\0STAR\0|\0QMARK\0)", pattern)
    regex = "".join(re.escape("*" if p == _LITERAL["*"] else "?") if p in (_LITERAL["*"], _LITERAL["?"])
                    else "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in p)
                    for p in parts)
    return re.fullmatch(regex, text, re.DOTALL | (re.IGNORECASE if ignore_case else 0)) is not None


POSITIVE = {"StringEquals": (False, False), "StringEqualsIgnoreCase": (False, True), "StringLike": (True, False),
            "ArnEquals": (False, False), "ArnLike": (True, False)}
NEGATED = {"StringNotEquals": "StringEquals", "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
           "StringNotLike": "StringLike", "ArnNotEquals": "ArnEquals", "ArnNotLike": "ArnLike"}


def _condition_holds(operator: str, key: str, values: Any, context: dict[str, Any]) -> bool:
    if operator.startswith(("ForAnyValue:", "ForAllValues:")):
        raise NotImplementedError(f"set operator {operator} is not ported")
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    present = key in context
    if not present:
        return if_exists or base in NEGATED or (base == "Null" and str(_as_list(values)[0]).lower() == "true")
    if base == "Null":
        return str(_as_list(values)[0]).lower() == "false"
    actual = str(context[key]).lower() if base == "Bool" else str(context[key])
    if base == "Bool":
        return any(str(v).lower() == actual for v in _as_list(values))
    negate = base in NEGATED
    like, ignore_case = POSITIVE[NEGATED.get(base, base)]
    hit = any(_match_value(substitute(str(v), context), actual, like=like, ignore_case=ignore_case)
              for v in _as_list(values))
    return not hit if negate else hit


@dataclass(frozen=True, kw_only=True)
class Request:
    action: str
    resource: str
    context: dict[str, Any] = field(default_factory=dict)
    """The request context: condition keys (``aws:PrincipalTag/...``, ``s3:ResourceAccount``, ...)."""


def statement_applies(statement: dict, request: Request) -> bool:
    if "Action" in statement:
        if not any(wildcard(a, request.action, ignore_case=True) for a in _as_list(statement["Action"])):
            return False
    elif any(wildcard(a, request.action, ignore_case=True) for a in _as_list(statement["NotAction"])):
        return False
    if "Resource" in statement or "NotResource" in statement:
        patterns = _as_list(statement.get("Resource", statement.get("NotResource")))
        hit = any(_match_value(substitute(p, request.context), request.resource, like=True) for p in patterns)
        if hit != ("Resource" in statement):
            return False
    for operator, keys in (statement.get("Condition") or {}).items():
        for key, values in keys.items():
            if not _condition_holds(operator, key, values, request.context):
                return False
    return True


def decide(policies: list[dict], request: Request) -> str:
    """``"Deny"`` (explicit), ``"Allow"`` or ``"ImplicitDeny"`` over identity-based policy documents."""
    statements = [s for p in policies for s in _as_list(p["Statement"])]
    applicable = [s for s in statements if statement_applies(s, request)]
    if any(s["Effect"] == "Deny" for s in applicable):
        return "Deny"
    return "Allow" if any(s["Effect"] == "Allow" for s in applicable) else "ImplicitDeny"


def allowed(policies: list[dict], request: Request) -> bool:
    return decide(policies, request) == "Allow"


def role_policies(template: dict, role_id: str, **resolve_args: Any) -> list[dict]:
    """The policy documents attached to one role of a synthesized template (inline AWS::IAM::Policy
    resources naming it), resolved as deployed."""
    return [resolve(r["Properties"]["PolicyDocument"], **resolve_args) for r in template["Resources"].values()
            if r["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in r["Properties"]["Roles"]]


def pod_identity_context(*, run: str, namespace: str = "ray", cluster: str = "raytrain",
                         account: str = ACCOUNT, region: str = REGION) -> dict[str, str]:
    """The session tags EKS Pod Identity sets on a pod's role session (Amazon EKS User Guide,
    "Grant Pods access to AWS resources based on tags"), as ``aws:PrincipalTag/<key>``, plus the
    account that owns the bucket (``s3:ResourceAccount``)."""
    tags = {"eks-cluster-arn": f"arn:{PARTITION}:eks:{region}:{account}:cluster/{cluster}",
            "eks-cluster-name": cluster, "kubernetes-namespace": namespace,
            "kubernetes-service-account": run, "kubernetes-pod-name": f"{run}-head-x",
            "kubernetes-pod-uid": "00000000-0000-0000-0000-000000000000"}
    return {**{f"aws:PrincipalTag/{k}": v for k, v in tags.items()}, "s3:ResourceAccount": account}


def assume_context(*, run: str, namespace: str = "ray", cluster: str = "raytrain",
                   account: str = ACCOUNT, region: str = REGION) -> dict[str, str]:
    """The AssumeRole request EKS Pod Identity makes: the same tags as ``aws:RequestTag/<key>``."""
    return {k.replace("aws:PrincipalTag/", "aws:RequestTag/"): v
            for k, v in pod_identity_context(run=run, namespace=namespace, cluster=cluster, account=account,
                                             region=region).items() if k.startswith("aws:PrincipalTag/")}
