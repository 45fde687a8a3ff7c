"""Static checks of infra/terraform, without terraform or its providers: every file parses
as far as `tests.infra.hcl` follows it, every reference resolves, providers are pinned, and
the security properties hold (private encrypted versioned bucket, Redis with TLS and an auth
token, least-privilege IRSA, tainted GPU nodes, no secrets in the code).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from tests.infra.hcl import Block, blocks, mask, string_list
from tests.infra.manifests import INFRA, base_documents, find, pod_spec

TERRAFORM = INFRA / "terraform"
TF_FILES = sorted(TERRAFORM.glob("*.tf"))
PROVIDERS = {"aws", "random"}


@cache
def _all_blocks() -> tuple[Block, ...]:
    return tuple(b for path in TF_FILES for b in blocks(path.read_text()))


def _code() -> str:
    """All .tf files with comments blanked out (strings kept: references live in them)."""
    return "\n".join(mask(path.read_text(), strings=False) for path in TF_FILES)


def _of(type_: str, *labels: str) -> list[Block]:
    return [b for b in _all_blocks() if b.type == type_ and b.labels[: len(labels)] == labels]


def _one(type_: str, *labels: str) -> Block:
    (block,) = _of(type_, *labels)
    return block


def _resource(resource_type: str) -> Block:
    (block,) = _of("resource", resource_type)
    return block


def _bucket_ref(block: Block) -> str:
    value = block.get("bucket") or ""
    names = [bucket.labels[1] for bucket in _of("resource", "aws_s3_bucket")]
    assert any(value.startswith(f"aws_s3_bucket.{name}.") for name in names), (
        f"{block.labels}: bucket = {value}"
    )
    return value


BUCKETS = ("weights", "batch_files")


def _of_bucket(resource_type: str, bucket: str) -> Block:
    """The `resource_type` resource of the bucket named `bucket`."""
    found = [
        b
        for b in _of("resource", resource_type)
        if _bucket_ref(b).startswith(f"aws_s3_bucket.{bucket}.")
    ]
    assert len(found) == 1, f"{resource_type} of {bucket}: {len(found)}"
    return found[0]


def test_the_expected_files_exist() -> None:
    names = {path.name for path in TERRAFORM.iterdir()}
    assert {"versions.tf", "variables.tf", "outputs.tf", "README.md"} <= names
    ignored = (TERRAFORM / ".gitignore").read_text().split()
    assert {"*.tfstate", "terraform.tfvars", ".terraform/"} <= set(ignored)


@pytest.mark.parametrize("path", TF_FILES, ids=lambda p: p.name)
def test_every_file_parses(path: Path) -> None:
    assert blocks(path.read_text()), f"{path.name}: no blocks"


def test_terraform_and_providers_are_pinned() -> None:
    terraform = _one("terraform")
    assert terraform.get("required_version")
    required = terraform.block("required_providers").attributes()
    assert set(required) == PROVIDERS
    for name, spec in required.items():
        assert re.search(rf'source\s*=\s*"hashicorp/{name}"', spec), spec
        version = re.search(r'version\s*=\s*"([^"]+)"', spec)
        assert version and re.fullmatch(r"(~>|=)?\s*\d+\.\d+(\.\d+)?", version.group(1)), spec
    used = {b.labels[0].split("_", 1)[0] for b in _all_blocks() if b.type in ("resource", "data")}
    assert used <= PROVIDERS


def test_every_variable_is_declared_documented_and_used() -> None:
    declared = {b.labels[0]: b for b in _of("variable")}
    code = _code()
    used = set(re.findall(r"\bvar\.(\w+)", code))
    assert used <= set(declared), f"undeclared: {used - set(declared)}"
    assert set(declared) <= used, f"unused: {set(declared) - used}"
    for name, block in declared.items():
        assert block.get("description"), f"variable {name} has no description"
        assert block.get("type"), f"variable {name} has no type"


def test_every_reference_resolves() -> None:
    code = _code()
    locals_ = {name for b in _of("locals") for name in b.attributes()}
    resources = {b.labels for b in _of("resource")}
    data = {b.labels for b in _of("data")}
    assert set(re.findall(r"\blocal\.(\w+)", code)) <= locals_
    for ref in set(re.findall(r"\bdata\.(\w+)\.(\w+)", code)):
        assert ref in data, f"data.{ref[0]}.{ref[1]} is not declared"
    for ref in set(re.findall(r"(?<![\w.])((?:aws|random)_\w+)\.(\w+)", code)):
        assert ref in resources, f"{ref[0]}.{ref[1]} is not declared"


def test_outputs_are_documented_and_secrets_are_sensitive() -> None:
    outputs = _of("output")
    assert outputs
    locals_ = {name: value for b in _of("locals") for name, value in b.attributes().items()}
    for output in outputs:
        assert output.get("description"), output.labels
        value = output.get("value") or ""
        secret = (
            "random_password" in value
            or "auth_token" in value
            or (value.startswith("local.") and "random_password" in locals_.get(value[6:], ""))
        )
        if secret:
            assert output.get("sensitive") == "true", f"output {output.labels[0]} leaks a secret"


def test_no_hard_coded_secrets() -> None:
    for block in _all_blocks():
        for name, value in block.attributes().items():
            if re.search(r"password|secret_string|auth_token$|access_key|secret_key", name):
                assert not value.startswith('"'), f"{block.labels}: {name} is a literal"


# ---- the weights bucket -----------------------------------------------------------------


def test_every_bucket_is_one_the_tests_know() -> None:
    assert sorted(b.labels[1] for b in _of("resource", "aws_s3_bucket")) == sorted(BUCKETS)


@pytest.mark.parametrize("bucket", BUCKETS)
def test_bucket_blocks_all_public_access(bucket: str) -> None:
    block = _of_bucket("aws_s3_bucket_public_access_block", bucket)
    for flag in (
        "block_public_acls",
        "block_public_policy",
        "ignore_public_acls",
        "restrict_public_buckets",
    ):
        assert block.get(flag) == "true", flag


@pytest.mark.parametrize("bucket", BUCKETS)
def test_bucket_is_encrypted_with_a_rotated_key(bucket: str) -> None:
    encryption = _of_bucket("aws_s3_bucket_server_side_encryption_configuration", bucket)
    default = encryption.block("rule").block("apply_server_side_encryption_by_default")
    assert default.get("sse_algorithm") in ('"aws:kms"', '"aws:kms:dsse"', '"AES256"')
    if "kms" in (default.get("sse_algorithm") or ""):
        key_ref = default.get("kms_master_key_id") or ""
        assert key_ref.startswith("aws_kms_key."), key_ref
        assert (
            _one("resource", "aws_kms_key", key_ref.split(".")[1]).get("enable_key_rotation")
            == "true"
        )


def test_weights_are_versioned_and_deleted_batch_files_are_gone() -> None:
    versioning = _of_bucket("aws_s3_bucket_versioning", "weights")
    assert versioning.block("versioning_configuration").get("status") == '"Enabled"'
    # A deleted batch file (its tenant's, expired, or with its tenant) keeps no version.
    assert all(
        not _bucket_ref(b).startswith("aws_s3_bucket.batch_files.")
        for b in _of("resource", "aws_s3_bucket_versioning")
    )


@pytest.mark.parametrize("document", ["weights_bucket", "batch_files_bucket"])
def test_bucket_refuses_plain_http(document: str) -> None:
    policy = _one("data", "aws_iam_policy_document", document)
    (statement,) = policy.blocks("statement")
    assert statement.get("effect") == '"Deny"'
    condition = statement.block("condition")
    assert condition.get("variable") == '"aws:SecureTransport"'
    assert string_list(condition.get("values") or "") == ["false"]


# ---- Redis ------------------------------------------------------------------------------


def test_redis_has_tls_an_auth_token_and_private_subnets() -> None:
    redis = _resource("aws_elasticache_replication_group")
    assert redis.get("transit_encryption_enabled") == "true"
    assert redis.get("at_rest_encryption_enabled") == "true"
    token = redis.get("auth_token") or ""
    assert token.startswith(("random_password.", "var.")), "auth_token must not be a literal"
    assert redis.get("auth_token_update_strategy"), "required by the AWS provider 6 with a token"
    assert redis.get("automatic_failover_enabled") == "true"
    assert (redis.get("subnet_group_name") or "").startswith("aws_elasticache_subnet_group.")
    assert "aws_security_group." in (redis.get("security_group_ids") or "")
    subnets = _resource("aws_elasticache_subnet_group")
    assert subnets.get("subnet_ids") == "var.private_subnet_ids"


def test_redis_is_reachable_only_from_the_cluster() -> None:
    rules = _of("resource", "aws_vpc_security_group_ingress_rule")
    assert rules
    for rule in rules:
        assert "cidr_ipv4" not in rule.attributes() and "cidr_ipv6" not in rule.attributes()
        assert rule.get("referenced_security_group_id")
    assert not _of("resource", "aws_security_group_rule")


# ---- IRSA ------------------------------------------------------------------------------


def _statements(document: str) -> list[Block]:
    return _one("data", "aws_iam_policy_document", document).blocks("statement")


def test_irsa_role_reads_only_the_weights_prefix() -> None:
    statements = _statements("weights_reader")
    actions = {a for s in statements for a in string_list(s.get("actions") or "")}
    assert actions <= {"s3:GetObject", "s3:ListBucket", "kms:Decrypt"}
    assert {"s3:GetObject", "s3:ListBucket"} <= actions
    for statement in statements:
        assert statement.get("effect") == '"Allow"'
        resources = statement.get("resources") or ""
        assert '"*"' not in resources
        kinds = string_list(statement.get("actions") or "")
        if kinds == ["s3:GetObject"]:
            assert "var.weights_prefix" in resources
        if kinds == ["s3:ListBucket"]:
            condition = statement.block("condition")
            assert condition.get("variable") == '"s3:prefix"'
            assert "var.weights_prefix" in (condition.get("values") or "")


def test_irsa_role_trusts_only_named_service_accounts() -> None:
    (statement,) = _statements("weights_reader_trust")
    assert string_list(statement.get("actions") or "") == ["sts:AssumeRoleWithWebIdentity"]
    conditions = {c.get("variable"): c for c in statement.blocks("condition")}
    sub = next(c for v, c in conditions.items() if v and v.endswith(':sub"'))
    assert sub.get("test") == '"StringEquals"'
    assert "system:serviceaccount:${var.k8s_namespace}:" in (sub.get("values") or "")
    assert any(v and v.endswith(':aud"') for v in conditions)


def test_gateway_role_touches_only_the_batch_files_prefix() -> None:
    statements = _statements("gateway")
    actions = {a for s in statements for a in string_list(s.get("actions") or "")}
    assert actions == {
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "kms:Decrypt",
        "kms:GenerateDataKey",
    }
    for statement in statements:
        assert statement.get("effect") == '"Allow"'
        resources = statement.get("resources") or ""
        assert '"*"' not in resources and "weights" not in resources
        if "s3:PutObject" in (statement.get("actions") or ""):
            assert "aws_s3_bucket.batch_files.arn" in resources
            assert "var.batch_files_prefix" in resources
        else:
            assert resources == "[aws_kms_key.batch_files.arn]"
            assert statement.block("condition").get("variable") == '"kms:ViaService"'


def test_gateway_role_trusts_only_the_gateway_service_account() -> None:
    (statement,) = _statements("gateway_trust")
    assert string_list(statement.get("actions") or "") == ["sts:AssumeRoleWithWebIdentity"]
    conditions = {c.get("variable"): c for c in statement.blocks("condition")}
    sub = next(c for v, c in conditions.items() if v and v.endswith(':sub"'))
    assert sub.get("test") == '"StringEquals"'
    values = sub.get("values") or ""
    assert "${var.k8s_namespace}:${var.gateway_service_account}" in values


# ---- GPU node group ---------------------------------------------------------------------


def test_gpu_node_group_is_labelled_and_tainted() -> None:
    group = _resource("aws_eks_node_group")
    assert "NVIDIA" in (group.get("ami_type") or "") or "GPU" in (group.get("ami_type") or "")
    taint = group.block("taint")
    locals_ = {name: value for b in _of("locals") for name, value in b.attributes().items()}
    taint_spec = locals_["gpu_node_taint"]
    assert '"nvidia.com/gpu"' in taint_spec and '"NO_SCHEDULE"' in taint_spec
    assert taint.get("key") == "local.gpu_node_taint.key"
    assert group.get("labels") == "local.gpu_node_labels"
    assert '"inference-gateway.io/gpu" = "true"' in locals_["gpu_node_labels"]


def test_gpu_nodes_match_the_kubernetes_manifests() -> None:
    worker = pod_spec(find(base_documents(), "Deployment", "model-worker"))
    assert worker["nodeSelector"] == {"inference-gateway.io/gpu": "true"}
    (host_path,) = [v["hostPath"]["path"] for v in worker["volumes"] if "hostPath" in v]
    locals_ = {name: value for b in _of("locals") for name, value in b.attributes().items()}
    assert locals_["weights_host_path"] == f'"{host_path}"'
    user = pod_spec(find(base_documents(), "Deployment", "gateway"))["securityContext"]
    launch = _resource("aws_launch_template").get("user_data") or ""
    assert f"-o {user['runAsUser']} -g {user['runAsGroup']}" in launch
