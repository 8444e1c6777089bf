"""The battery of bad inputs: each is a mistake a new user makes, refused in one line that names
the field, by the FASTEST entry point that can see it. Shared by the tests and
bench/bench_refusals.py (which times each entry point).

Kinds and their entry point:
- ``env``: environment.toml (``load_environment``: ``raytrain-eks summary``, ``cdk synth``, ``cdk8s synth``);
- ``job`` and ``model``: a job config (``load_job_config`` + ``check_model``: ``python -m training --check``);
- ``data``: the data a job names (``check_data``: ``--check``, preflight and the job's driver);
- ``plan``: a job against the environment (``plan_job`` at synth, or ``run_preflight``).
"""
from __future__ import annotations

import json
from pathlib import Path

from fixture_paths import FIXTURE_JOBS

ROOT = Path(__file__).resolve().parents[2]
LOCAL_JOB = FIXTURE_JOBS / "local.toml"

CHAT_OK = {"messages": [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4"}]}
TEXT_OK = {"text": "A sentence of ordinary training text, long enough to count for something."}
ALPACA_OK = {"instruction": "Add the two numbers.", "input": "2 and 3", "output": "They add up to 5."}
SHAREGPT_OK = {"conversations": [{"from": "human", "value": "What is 2 + 2?"}, {"from": "gpt", "value": "4"}]}


OVERLONG_CHAT = {"messages": [{"role": "user", "content": "Tell me a long story."},
                               {"role": "assistant", "content": "once upon a time " * 40}]}
"""An answer far longer than the fixture local job's train.seq_len (128)."""


def _lines(records, n=40) -> str:
    return "".join(json.dumps(r) + "\n" for r in records * n)


# (id, environment mutation, words the one line must contain: the field first)
ENV_CASES = [
    ("region-typo", lambda r: r["cluster"].update(region="us-east-3", availability_zones=["us-east-3a", "us-east-3b"],
                                                 gpu_availability_zone="us-east-3a"),
     "cluster.region: 'us-east-3' is not an AWS region name; in that area: us-east-1, us-east-2"),
    ("region-transposed", lambda r: r["cluster"].update(region="eu-wset-1"), "cluster.region: 'eu-wset-1'"),
    ("region-govcloud-2", lambda r: r["cluster"].update(region="us-gov-east-2"), "cluster.region: 'us-gov-east-2'"),
    ("k8s-without-layer", lambda r: r["cluster"].update(kubernetes_version="1.35"),
     "cluster.kubernetes_version: '1.35' is not supported by this CDK app (supported: 1.36"),
    ("k8s-future", lambda r: r["cluster"].update(kubernetes_version="1.37"), "cluster.kubernetes_version: '1.37'"),
    ("k8s-number", lambda r: r["cluster"].update(kubernetes_version=1.36), "cluster.kubernetes_version: 1.36 is not allowed (expected a string)"),
    ("bucket-dash-period", lambda r: r["storage"].update(bucket_name="my-.bucket"),
     "storage.bucket_name: 'my-.bucket' is not a valid S3 bucket name (a dash next to a period)"),
    ("bucket-period-dash", lambda r: r["storage"].update(bucket_name="my.-bucket"), "storage.bucket_name: 'my.-bucket'"),
    ("bucket-two-periods", lambda r: r["storage"].update(bucket_name="my..bucket"), "storage.bucket_name: 'my..bucket'"),
    ("bucket-ip", lambda r: r["storage"].update(bucket_name="192.168.1.10"), "storage.bucket_name: '192.168.1.10'"),
    ("bucket-reserved-prefix", lambda r: r["storage"].update(bucket_name="xn--ckpts"), "storage.bucket_name: 'xn--ckpts'"),
    ("bucket-reserved-suffix", lambda r: r["storage"].update(bucket_name="ckpts-s3alias"), "storage.bucket_name: 'ckpts-s3alias'"),
    ("bucket-too-short", lambda r: r["storage"].update(bucket_name="ab"), "storage.bucket_name: 'ab' is 2 characters"),
    ("storage-prefix-dot-dot", lambda r: r["storage"].update(prefix="runs/../code"),
     "storage.prefix: 'runs/../code' holds a '.' or '..' segment"),
    ("storage-prefix-in-read-only", lambda r: r["storage"].update(prefix="data/runs"),
     "storage.prefix: 'data/runs' lies inside 'data', a prefix the pods may only read"),
    ("shared-path-without-claim", lambda r: r["storage"].update(shared_path="/fsx/runs"),
     "storage.shared_claim: '' is required with storage.shared_path / shared_claim (set both, or neither)"),
    ("shared-path-relative", lambda r: r["storage"].update(shared_path="fsx/runs", shared_claim="fsx-runs"),
     "storage.shared_path: 'fsx/runs' is not an absolute path"),
    # (a 40-character cluster name no longer derives a bad bucket name: the derivation shortens it
    # with a hash and the result passes the same rules, see tests/environment)
    ("schedule-1-hours", lambda r: r["pipeline"].update(watch_schedule="rate(1 hours)"),
     "pipeline.watch_schedule: 'rate(1 hours)' is not an EventBridge schedule: rate(1 ...) takes the unit minute / hour / day"),
    ("schedule-2-hour", lambda r: r["pipeline"].update(watch_schedule="rate(2 hour)"), "pipeline.watch_schedule: 'rate(2 hour)'"),
    ("schedule-rate-0", lambda r: r["pipeline"].update(watch_schedule="rate(0 minutes)"), "pipeline.watch_schedule: 'rate(0 minutes)'"),
    ("schedule-unix-cron", lambda r: r["pipeline"].update(watch_schedule="cron(0 */6 * * *)"),
     "pipeline.watch_schedule: 'cron(0 */6 * * *)' is not an EventBridge schedule: cron(...) has 5 fields"),
    ("schedule-no-question-mark", lambda r: r["pipeline"].update(watch_schedule="cron(0 12 * * * *)"),
     "exactly one of day-of-month and day-of-week must be '?'"),
    ("schedule-minute-61", lambda r: r["pipeline"].update(watch_schedule="cron(61 * * * ? *)"), "cron minutes field '61' is outside 0-59"),
    ("schedule-words", lambda r: r["pipeline"].update(watch_schedule="hourly"), "pipeline.watch_schedule: 'hourly'"),
    ("tag-names-other-ray", lambda r: r["image"].update(tag="2.40.0-py311-cu121"),
     "image.tag: '2.40.0-py311-cu121' names Ray 2.40.0 but image.ray_version is 2.58.0"),
    ("tag-names-other-ray-prefix", lambda r: r["image"].update(tag="ray-2.41"), "image.tag: 'ray-2.41' names Ray 2.41"),
    ("cluster-name-digit-first", lambda r: r["cluster"].update(name="1train"),
     "cluster.name: '1train' is not a lower-case name of 1-40 letters, digits and '-' starting with a letter"),
    ("python-version", lambda r: r["image"].update(python_version="3"), "image.python_version: '3'"),
    ("account-letters", lambda r: r["cluster"].update(account="12345678901a"), "cluster.account: '12345678901a'"),
    ("az-without-letter", lambda r: r["cluster"].update(availability_zones=["us-east-1", "us-east-1b"]),
     "cluster.availability_zones[0]: 'us-east-1' is not an AZ of region us-east-1"),
    ("service-account", lambda r: r["ray"].update(service_account="Ray_Train"), "ray.service_account: 'Ray_Train'"),
    ("namespace-node-lease", lambda r: r["ray"].update(namespace="kube-node-lease"), "ray.namespace: 'kube-node-lease' is reserved"),
    ("branch", lambda r: r["pipeline"].update(branch="feature..x"), "pipeline.branch: 'feature..x' is not a git branch name"),
    ("system-nodes-0", lambda r: r["system_node_group"].update(nodes=0), "system_node_group.nodes: 0 must be between 1 and 10"),
    ("max-nodes-0", lambda r: r["gpu_node_groups"][0].update(max_nodes=0, min_nodes=0, desired_nodes=0),
     "gpu_node_groups[0].max_nodes: 0 must be >= 1"),
    ("plugin-version", lambda r: r["versions"].update(nvidia_device_plugin="0.20"), "versions.nvidia_device_plugin: '0.20'"),
    ("section-typo", lambda r: r.update(imag={}), "imag: 'imag' is not a known section (known: "),
    ("field-typo", lambda r: r["image"].update(ray_verison="2.58.0"), "image.ray_verison: 'ray_verison' is not a known field"),
    ("read-only-without-code", lambda r: r["storage"].update(read_only_prefixes=["models"]),
     "storage.read_only_prefixes: ['models'] must include 'code'"),
    # (no node-group name length case: node groups have no fixed name; CloudFormation names them)
    ("group-name-too-long", lambda r: r["gpu_node_groups"][0].update(name="g" * 64),
     "gpu_node_groups[0].name: '" + "g" * 64 + "' must be a unique lower-case name"),
    ("group-name-upper", lambda r: r["gpu_node_groups"][0].update(name="GPU"), "gpu_node_groups[0].name: 'GPU'"),
    ("price-string", lambda r: r.update(prices={"g6.12xlarge": "4.6"}), "prices.g6.12xlarge: '4.6' must be a positive number"),
    ("endpoint-case", lambda r: r["cluster"].update(endpoint_access="Public"), "cluster.endpoint_access: 'Public'"),
    ("admin-arn-short-account", lambda r: r["cluster"].update(admin_principal_arns=["arn:aws:iam::123:role/admin"]),
     "cluster.admin_principal_arns[0]: 'arn:aws:iam::123:role/admin'"),
    # found by the schema engine's sweep (wrong types, unicode, duplicates, non-finite numbers)
    ("account-unicode-digits", lambda r: r["cluster"].update(account="\u0661" * 12), "cluster.account: '\u0661"),
    ("tag-unicode", lambda r: r["image"].update(tag="t\u00e4g"), "image.tag: 't\u00e4g' is not a valid image tag"),
    ("ray-version-unicode-digits", lambda r: r["image"].update(ray_version="\u0662.58.0"), "image.ray_version: '\u0662.58.0'"),
    ("admin-arn-twice", lambda r: r["cluster"].update(admin_principal_arns=["arn:aws:iam::111122223333:role/a"] * 2),
     "cluster.admin_principal_arns[1]: 'arn:aws:iam::111122223333:role/a' is listed twice"),
    ("cidr-twice", lambda r: r["cluster"].update(public_access_cidrs=["203.0.113.0/24"] * 2),
     "cluster.public_access_cidrs[1]: '203.0.113.0/24' is listed twice"),
    ("cidr-bare-address", lambda r: r["cluster"].update(public_access_cidrs=["203.0.113.7"]),
     "cluster.public_access_cidrs[0]: '203.0.113.7' is not an IPv4 CIDR"),
    ("read-only-twice", lambda r: r["storage"].update(read_only_prefixes=["code", "code"]),
     "storage.read_only_prefixes: ['code', 'code'] lists a prefix twice"),
    ("python-too-old", lambda r: r["image"].update(python_version="3.9"),
     "image.python_version: '3.9' is older than the training package needs (3.11 or newer"),
    ("fraction-nan", lambda r: r["pipeline"].update(min_tokens_per_s_fraction=float("nan")),
     "pipeline.min_tokens_per_s_fraction: nan is not allowed (expected a finite number)"),
    ("window-words", lambda r: r["pipeline"].update(maintenance_window="weekends"),
     "pipeline.maintenance_window: 'weekends' is not \"<days> HH:MM-HH:MM\" (UTC"),
    ("window-day-typo", lambda r: r["pipeline"].update(maintenance_window="sat,snu 02:00-06:00"),
     "pipeline.maintenance_window: 'sat,snu 02:00-06:00' has unknown day(s) snu"),
    ("window-empty", lambda r: r["pipeline"].update(maintenance_window="daily 02:00-02:00"),
     "pipeline.maintenance_window: 'daily 02:00-02:00' opens and closes at the same minute"),
    ("attempts-zero", lambda r: r["pipeline"].update(max_attempts=0),
     "pipeline.max_attempts: 0 must be between 1 and 20"),
    ("notify-not-address", lambda r: r["pipeline"].update(notify_emails=["oncall"]),
     "pipeline.notify_emails: 'oncall' is not an e-mail address"),
    ("price-inf", lambda r: r.update(prices={"g6.12xlarge": float("inf")}), "prices.g6.12xlarge: inf must be a positive number"),
    ("groups-empty", lambda r: r.update(gpu_node_groups=[]), "gpu_node_groups: [] has no group: list at least one"),
    ("groups-one-table", lambda r: r.update(gpu_node_groups={"name": "gpu"}),
     "gpu_node_groups: {'name': 'gpu'} is not allowed (expected a list of [[gpu_node_groups]] tables)"),
    ("versions-not-table", lambda r: r.update(versions=["1.7.0"]), "versions: ['1.7.0'] is not allowed (expected a table"),
    ("versions-typo", lambda r: r["versions"].update(kuberay_opertor="1.7.0"),
     "versions.kuberay_opertor: 'kuberay_opertor' is not a known add-on (known: "),
    ("head-cpu-bool", lambda r: r["ray"].update(head_cpu=True), "ray.head_cpu: True is not allowed (expected an integer)"),
    ("min-over-max", lambda r: r["gpu_node_groups"][0].update(min_nodes=3, desired_nodes=3),
     "gpu_node_groups[0].min_nodes: 3 must be <= max_nodes (2)"),
    ("section-not-table", lambda r: r.update(storage="s3://x"), "storage: 's3://x' is not allowed (expected a table)"),
]

# The [optim] section, one bad value per field, and parallel.cpu_offload (test_rules.py also runs
# each through the CLI):
# (field, the value as --set writes it, the words after "optim.<field>: ")
_OPTIM_BAD = {
    "beta1": ("1.0", "1.0 must be at least 0 and below 1 (torch.optim.AdamW's betas)"),
    "beta2": ("-0.1", "-0.1 must be at least 0 and below 1"),
    "eps": ("-1e-8", "-1e-08 must be >= 0"),
    "no_decay": ("'bias'", "'bias' is not allowed (allowed: 1d, none)"),
    "kernel": ("'apex'", "'apex' is not allowed (allowed: auto, fused, foreach, for_loop)"),
    "schedule": ("'wsd'", "'wsd' is not allowed (allowed: cosine, linear, constant)"),
    "betas": ("[0.9, 0.95]", "'betas' is not a known field (known: beta1, beta2"),
}
OPTIM_CASES = [(f"optim-{field}", [f"optim.{field}={value}"], f"optim.{field}: {words}")
               for field, (value, words) in _OPTIM_BAD.items()] + [
    ("offload-word", ["parallel.cpu_offload='yes'"], "parallel.cpu_offload: 'yes' is not allowed (expected true or false)"),
]

# (id, --set overrides on the local job, words): refused by load_job_config or check_model
JOB_CASES = [*OPTIM_CASES,
    ("model-key-typo", ["model.config.num_hidden_layer=2"],
     "model.config.num_hidden_layer: 'num_hidden_layer' is not a known Qwen2Config key (known: "),
    ("model-key-typo-hidden", ["model.config.hidden_sise=64"], "vocab_size; did you mean 'hidden_size'?)"),
    ("model-key-typo-rope", ["model.config.rope_thetta=10000.0"], "did you mean 'rope_theta'?"),
    ("model-key-unknown", ["model.config.flash=true"], "model.config.flash: 'flash' is not a known Qwen2Config key (known: "),
    ("model-vocab-0", ["model.config.vocab_size=0"], "model.config.vocab_size: 0 must be a positive integer (below 2**31)"),
    ("model-heads-3", ["model.config.num_attention_heads=3"], "model.config.num_attention_heads: 3 must divide hidden_size (64)"),
    ("model-kv-heads-3", ["model.config.num_key_value_heads=3"], "model.config.num_key_value_heads: 3 must divide num_attention_heads (4)"),
    ("model-layers-string", ['model.config.num_hidden_layers="2"'], "model.config.num_hidden_layers: '2' must be a positive integer"),
    ("seq-beyond-config-positions", ["train.seq_len=4096"], "train.seq_len: 4096 exceeds the model's max_position_embeddings (2048)"),
    ("gpu-storage-local", ["parallel.use_gpu=true", "parallel.num_workers=8", "parallel.workers_per_node=4",
                           "checkpoint.storage_path=/tmp/ckpt", "train.global_batch_size=16"],
     "checkpoint.storage_path: '/tmp/ckpt' is a local directory but the job spans 2 nodes"),
    ("tokenizer-missing", ["model.tokenizer=/nonexistent/tokenizer"], "model.tokenizer: '/nonexistent/tokenizer' is not a directory"),
    ("eval-fraction", ["data.eval_fraction=0.6"], "data.eval_fraction: 0.6 must be between 0 and 0.5"),
    ("cpus-0", ["parallel.cpus_per_worker=0"], "parallel.cpus_per_worker: 0.0 must be > 0"),
    ("transport-word", ["evidence.require_transport=ib"], "evidence.require_transport: 'ib' is not allowed"),
    ("data-kind", ["data.kind=parquet"], "data.kind: 'parquet' is not allowed (allowed: synthetic, alpaca, chat, hf, jsonl, preference, sharegpt, text)"),
    ("deadline-0", ["rayjob.active_deadline_minutes=0"], "rayjob.active_deadline_minutes: 0 must be > 0"),
    ("section-typo", ["trian.seq_len=64"], "trian: 'trian' is not a known field"),
    # found by the schema engine's sweep
    ("lr-nan", ["train.lr=nan"], "train.lr: nan is not allowed (expected a finite number)"),
    ("cpus-inf", ["parallel.cpus_per_worker=inf"], "parallel.cpus_per_worker: inf is not allowed (expected a finite number)"),
    ("data-seed-negative", ["data.seed=-1"], "data.seed: -1 must be >= 0"),
    ("train-seed-huge", ["train.seed=18446744073709551616"], "train.seed: 18446744073709551616 must be between"),
    ("deadline-beyond-int32", ["rayjob.active_deadline_minutes=35791395"],
     "rayjob.active_deadline_minutes: 35791395 must be <= 35791394 (the RayJob field is a 32-bit integer)"),
    ("ttl-beyond-int32", ["rayjob.ttl_seconds_after_finished=2147483648"], "rayjob.ttl_seconds_after_finished: 2147483648 must be <="),
    ("checkpoint-every-beyond-steps", ["checkpoint.every_n_steps=41"],
     "checkpoint.every_n_steps: 41 is more than train.max_steps (40)"),
    ("eval-every-beyond-steps", ["eval.every_n_steps=100"], "eval.every_n_steps: 100 is more than train.max_steps (40)"),
    ("storage-s3-no-bucket", ["checkpoint.storage_path='s3://'"], "checkpoint.storage_path: 's3://' is not s3://bucket/prefix"),
    ("model-hidden-default-heads", ["model.config.hidden_size=100"],
     "model.config.num_attention_heads: 4 gives an odd head size (100 / 4 = 25)"),
    ("model-eps-int", ["model.config.rms_norm_eps=1"], "model.config.rms_norm_eps: 1 is not allowed (Qwen2Config takes a number"),
    ("model-tie-int", ["model.config.tie_word_embeddings=1"], "model.config.tie_word_embeddings: 1 is not allowed (Qwen2Config takes true or false)"),
    ("model-activation", ["model.config.hidden_act='swiglu'"], "model.config.hidden_act: 'swiglu' is not an activation transformers knows"),
    ("model-path-missing", ["model.path=/no/such/model"],
     "model.path: '/no/such/model' does not exist here and is not a Hugging Face hub id"),
    ("model-path-relative-missing", ["model.path=./models/qwen"], "model.path: './models/qwen' does not exist here"),
    ("name-number", ["name=5"], "name: 5 is not allowed (expected a string)"),
    ("data-s3-no-bucket", ["data.kind=jsonl", "data.path='s3://'"], "data.path: 's3://' is not s3://bucket/prefix"),
    ("model-s3-no-bucket", ["model.path='s3:///models/x'"], "model.path: 's3:///models/x' is not s3://bucket/prefix"),
    ("model-size-huge", ["model.config.vocab_size=99999999999999999999"],
     "model.config.vocab_size: 99999999999999999999 must be a positive integer (below 2**31)"),
    ("section-not-table", ["train='fast'"], "train: 'fast' is not allowed (expected a table)"),
]

# (id, kind, file name, content (str or bytes), extra --set, words)
DATA_CASES = [
    ("malformed-line", "jsonl", "c.jsonl", _lines([TEXT_OK], 5) + '{"text": "unterminated\n' + _lines([TEXT_OK], 5), [],
     "c.jsonl, line 6: not valid JSON"),
    ("empty-file", "jsonl", "c.jsonl", "", [], "c.jsonl, line 1: empty file"),
    ("wrong-field", "jsonl", "c.jsonl", _lines([{"content": "x"}], 3), [], "c.jsonl, line 1: missing field 'text' (expected {\"text\": \"...\"}; found: content)"),
    ("json-array", "jsonl", "c.jsonl", json.dumps([TEXT_OK] * 3, indent=2), [], "c.jsonl, line 1: not valid JSON (Expecting value at column 2); the file is one JSON array, not JSON Lines"),
    ("json-array-one-line", "jsonl", "c.jsonl", json.dumps([TEXT_OK] * 3) + "\n", [], "c.jsonl, line 1: expected a JSON object, got list; the file is one JSON array"),
    ("chat-records-as-jsonl", "jsonl", "c.jsonl", _lines([CHAT_OK]), [], "set data.kind = 'chat'"),
    ("text-null", "jsonl", "c.jsonl", _lines([{"text": None}]), [], "c.jsonl, line 1: field 'text' must be a string, got NoneType"),
    ("sharegpt", "chat", "c.jsonl", _lines([{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]),
     [], "c.jsonl, line 1: missing field 'messages' (expected {\"messages\": [{\"role\", \"content\"}, ...]}; found: conversations): ShareGPT"),
    ("sharegpt-turns", "chat", "c.jsonl", _lines([{"messages": [{"from": "human", "value": "hi"}]}]), [],
     "c.jsonl, line 1: messages[0] has no 'role' but 'from': ShareGPT"),
    ("chat-no-assistant", "chat", "c.jsonl", _lines([{"messages": [{"role": "user", "content": "hi"}]}]), [],
     "c.jsonl, line 1: no assistant message"),
    ("chat-assistant-first", "chat", "c.jsonl", _lines([{"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "yo"}]}]),
     [], "c.jsonl, line 1: the first assistant message must follow a user message"),
    ("chat-role-human", "chat", "c.jsonl", _lines([{"messages": [{"role": "human", "content": "hi"}, {"role": "assistant", "content": "x"}]}]),
     [], "c.jsonl, line 1: messages[0].role is 'human'; allowed: system, user, assistant"),
    ("chat-empty-answer", "chat", "c.jsonl", _lines([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}]}]),
     [], "every assistant message is empty"),
    ("alpaca-output-number", "alpaca", "c.jsonl", _lines([ALPACA_OK]) + '{"instruction": "x", "output": 5}\n', [],
     "c.jsonl, line 41: field 'output' must be a string, got int (5)"),
    ("alpaca-array-wrong-field", "alpaca", "c.json",
     "[\n" + ",\n".join(json.dumps(r) for r in [ALPACA_OK] * 40 + [{"instruction": "x", "response": "y"}]) + "\n]\n", [],
     "c.json, line 42: missing field 'output'; found: instruction, response"),
    ("sharegpt-tool-turn", "sharegpt", "c.jsonl",
     _lines([SHAREGPT_OK]) + json.dumps({"conversations": [{"from": "human", "value": "q"}, {"from": "tool", "value": "t"}]}) + "\n",
     [], "c.jsonl, line 41: conversations[1].from is 'tool': tool turns are not supported"),
    ("sharegpt-as-alpaca", "alpaca", "c.jsonl", _lines([SHAREGPT_OK]), [],
     "c.jsonl, line 1: missing field 'instruction'; found: conversations"),
    ("non-utf8-text", "text", "c.txt", "caf\u00e9 au lait\n\nanother paragraph\n".encode("latin-1") * 20, [],
     "c.txt, line 1: not valid UTF-8"),
    ("whitespace-text", "text", "c.txt", "  \n\n \n", [], "c.txt, line 1: empty file"),
    ("dir-without-kind", "jsonl", "dir/c.json", _lines([TEXT_OK]), [],
     "no files ending in .jsonl (data.kind 'jsonl' reads .jsonl; it holds .json files)"),
    ("too-few-for-eval", "jsonl", "c.jsonl", _lines([TEXT_OK], 3), [],
     "3 document(s); data.eval_fraction 0.1 holds out none (needs at least 6 documents"),
    ("too-small-for-a-batch", "jsonl", "c.jsonl", _lines([{"text": "tiny"}], 20), [],
     "the train split holds at most 90 tokens, less than one global batch (train.global_batch_size 8 x train.seq_len 128 = 1024)"),
]

# (id, the model directory's config.json text, --set, words): a local model directory
MODEL_DIR_CASES = [
    ("config-json-truncated", '{"hidden_size": 64, "num_hidden_layers": 2,', [],
     "model.path: {model}/config.json is not valid JSON (line 1 column 44"),
    ("config-json-array", "[1, 2]", [], "model.path: {model}/config.json holds a JSON list, not an object"),
    ("config-json-positions", json.dumps({"max_position_embeddings": 64}), [],
     "train.seq_len: 128 exceeds the model's max_position_embeddings (64)"),
    ("config-json-positions-string", json.dumps({"max_position_embeddings": "4k"}), [],
     "model.path: {model}/config.json: max_position_embeddings '4k' is not a positive integer"),
    # a folder with config.json alone passed every check and failed 71 s into the run
    ("config-json-only", json.dumps({"max_position_embeddings": 2048}), [],
     "model.path: '{model}' holds config.json but no weights (*.safetensors, model.safetensors.index.json, "
     "pytorch_model*.bin): give the folder save_pretrained wrote"),
    ("config-json-only-no-tokenizer", json.dumps({"max_position_embeddings": 2048}), ["model.tokenizer="],
     "holds config.json but no weights (*.safetensors, model.safetensors.index.json, pytorch_model*.bin) and no "
     "tokenizer (tokenizer.json, or vocab.json + merges.txt, or tokenizer.model)"),
]

# (id, job TOML, where it is planned: "charts" or "preflight", words)
GPU_JOB = """
name = "gpu-job"
[model]
config = {{ hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, intermediate_size = 128, vocab_size = 1024, max_position_embeddings = 2048 }}
[data]
kind = "synthetic"
[train]
seq_len = 128
global_batch_size = 32
max_steps = 10
warmup_steps = 1
[parallel]
use_gpu = true
{parallel}
[checkpoint]
{checkpoint}
"""
PLAN_CASES = [
    ("cpus-per-worker-over-pod", GPU_JOB.format(parallel="cpus_per_worker = 12.0", checkpoint=""), "charts",
     "parallel.cpus_per_worker: 12 x workers_per_node 4 = 48 CPUs do not fit one worker pod (40 CPUs on g6.12xlarge)"),
    ("cpus-per-worker-preflight", GPU_JOB.format(parallel="cpus_per_worker = 11.0", checkpoint=""), "preflight",
     "parallel.cpus_per_worker: 11 x workers_per_node 4 = 44 CPUs do not fit one worker pod"),
    ("storage-local-rewritten", GPU_JOB.format(parallel="", checkpoint='storage_path = "/shared/ckpt"'), "charts",
     "checkpoint.storage_path: '/shared/ckpt' is a local directory but the job spans 2 nodes"),
    ("storage-local-single-node", GPU_JOB.format(parallel="num_workers = 4", checkpoint='storage_path = "/shared/ckpt"'),
     "charts", "checkpoint.storage_path: '/shared/ckpt' is set by the charts to the spec's s3://"),
    ("cpu-job-over-pod-preflight", GPU_JOB.format(parallel="num_workers = 48\nworkers_per_node = 48", checkpoint="")
     .replace("global_batch_size = 32", "global_batch_size = 48")
     .replace("use_gpu = true", "use_gpu = false"), "preflight",
     "parallel.num_workers: 48 x cpus_per_worker 1.0 = 48 CPUs do not fit one worker pod"),
    ("host-memory", GPU_JOB.replace("hidden_size = 64, num_hidden_layers = 2, num_attention_heads = 4, num_key_value_heads = 2, "
                                    "intermediate_size = 128, vocab_size = 1024",
                                    "hidden_size = 8192, num_hidden_layers = 80, num_attention_heads = 64, num_key_value_heads = 8, "
                                    "intermediate_size = 29568, vocab_size = 152064")
     .format(parallel="", checkpoint=""), "preflight",
     "parallel.workers_per_node: 4 workers each build the full model on the host before sharding"),
    ("workers-per-node-over-gpus", GPU_JOB.format(parallel="workers_per_node = 8", checkpoint=""), "charts",
     "parallel.workers_per_node: 8 is more than the 4 GPUs of one node"),
    ("accept-efa-on-cpu-job", GPU_JOB.format(parallel="num_workers = 2\nworkers_per_node = 2", checkpoint="")
     .replace("global_batch_size = 32", "global_batch_size = 8").replace("use_gpu = true", "use_gpu = false")
     + '[accept]\ntransport = "efa"\n', "preflight",
     "accept.transport = 'efa' but a local CPU job uses gloo on one machine"),
    ("accept-single-node-on-two-nodes", GPU_JOB.format(parallel="", checkpoint="") + '[accept]\ntransport = "single-node"\n',
     "preflight", "accept.transport = 'single-node' but the job spans 2 nodes"),
    ("seq-beyond-positions-at-synth", GPU_JOB.format(parallel="", checkpoint="").replace("seq_len = 128", "seq_len = 4096"), "charts",
     "train.seq_len: 4096 exceeds the model's max_position_embeddings (2048)"),
]
