"""The data layer's Terraform modules (infra/terraform/modules/{storage,database,irsa}), read
statically with python-hcl2: no provider, no plan, no AWS account.

Each property is a `check_*` function over the parsed modules. `test_properties` runs them on the
real files; `test_check_catches` breaks the parsed modules one way at a time (a flag flipped, a
wildcard added, ...) and requires the matching check to fail, so no check passes vacuously.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Callable

import pytest

from tests.terraform_support import module

MODULE_NAMES = ("storage", "database", "irsa")
REF = re.compile(r"^\$\{([^{}]+)\}$")  # an attribute that is a single reference, e.g. ${var.x}

Modules = dict[str, dict[str, list[dict[str, Any]]]]


def parse_modules() -> Modules:
    # Copies: test_check_catches mutates them, and the parsed modules are cached for every test.
    return {name: copy.deepcopy(module(name).blocks) for name in MODULE_NAMES}


@pytest.fixture(scope="module")
def modules() -> Modules:
    return parse_modules()


# -- access helpers ------------------------------------------------------------------------------


def labelled(mod: dict, kind: str, type_: str) -> dict[str, dict]:
    """Bodies of `resource`/`data` blocks of one type, by name."""
    found: dict[str, dict] = {}
    for item in mod.get(kind, []):
        for name, body in item.get(type_, {}).items():
            found[name] = body
    return found


def resources(mod: dict, type_: str) -> dict[str, dict]:
    return labelled(mod, "resource", type_)


def one_resource(mod: dict, type_: str) -> dict:
    found = resources(mod, type_)
    assert len(found) == 1, f"expected exactly one {type_}, found {sorted(found)}"
    return next(iter(found.values()))


def variables(mod: dict) -> dict[str, dict]:
    return {name: body for item in mod.get("variable", []) for name, body in item.items()}


def locals_(mod: dict) -> dict[str, Any]:
    return {k: v for item in mod.get("locals", []) for k, v in item.items()}


def ref(value: Any) -> str | None:
    """`var.x` for "${var.x}"; None for anything that is not a single reference."""
    match = REF.match(value) if isinstance(value, str) else None
    return match.group(1).strip() if match else None


def resolve(mod: dict, value: Any) -> Any:
    """Follows `${local.x}` to the local's own expression (as many times as needed)."""
    seen = 0
    while (target := ref(value)) and target.startswith("local.") and seen < 10:
        value = locals_(mod)[target.removeprefix("local.")]
        seen += 1
    return value


def default_of(mod: dict, value: Any) -> Any:
    """The default of the variable `value` refers to (the attribute must be exactly ${var.x})."""
    target = ref(value)
    assert target and target.startswith("var."), f"{value!r} is not a variable reference"
    variable = variables(mod)[target.removeprefix("var.")]
    assert "default" in variable, f"{target} has no default"
    return variable["default"]


def block(body: dict, key: str) -> dict:
    """The single nested block `key` of a body (hcl2 gives blocks as lists of dicts)."""
    items = body.get(key)
    assert isinstance(items, list) and len(items) == 1, f"expected one {key} block, found {items!r}"
    return items[0]


def module_key_refs(mod: dict, attribute: str = "arn") -> set[str]:
    """References to the module's own KMS keys, e.g. {'aws_kms_key.this.arn'}."""
    return {
        f"aws_kms_key.{name}.{attribute}"
        for name, body in resources(mod, "aws_kms_key").items()
        if body.get("enable_key_rotation") is True
    }


def policy_documents(mod: dict) -> dict[str, dict]:
    return labelled(mod, "data", "aws_iam_policy_document")


def statements(document: dict) -> list[dict]:
    """Static `statement` blocks and the `content` of `dynamic "statement"` blocks."""
    found = list(document.get("statement", []))
    for dynamic in document.get("dynamic", []):
        for label, body in dynamic.items():
            if label == "statement":
                found.extend(body["content"])
    return found


def document_of(mod: dict, value: Any) -> dict:
    """The aws_iam_policy_document a `policy = data.aws_iam_policy_document.x.json` names."""
    target = ref(value) or ""
    match = re.fullmatch(r"data\.aws_iam_policy_document\.(\w+)\.json", target)
    assert match, f"policy {value!r} is not rendered by an aws_iam_policy_document"
    return policy_documents(mod)[match.group(1)]


def literal_list(mod: dict, value: Any) -> list:
    value = resolve(mod, value)
    assert isinstance(value, list), f"expected a literal list, got {value!r}"
    return value


# -- checks --------------------------------------------------------------------------------------


def check_variables_documented(modules: Modules) -> None:
    for name, mod in modules.items():
        found = variables(mod)
        assert found, f"{name}: no variables parsed"
        for var_name, body in found.items():
            assert isinstance(body.get("description"), str) and body["description"].strip(), (
                f"{name}.{var_name}: no description"
            )
            assert body.get("type"), f"{name}.{var_name}: no type"


def check_versions_and_no_providers(modules: Modules) -> None:
    for name, mod in modules.items():
        assert "provider" not in mod, f"{name}: modules must not configure providers"
        terraform = mod.get("terraform")
        assert terraform and len(terraform) == 1, f"{name}: one terraform block expected"
        assert terraform[0]["required_version"] == ">= 1.6", name
        aws = block(terraform[0], "required_providers")["aws"]
        assert aws == {"source": "hashicorp/aws", "version": "~> 5.0"}, f"{name}: {aws}"


def check_public_access_block(modules: Modules) -> None:
    storage = modules["storage"]
    assert set(resources(storage, "aws_s3_bucket")) == {"this"}
    pab = one_resource(storage, "aws_s3_bucket_public_access_block")
    assert pab["bucket"] == "${aws_s3_bucket.this.id}"
    for flag in ("block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets"):
        assert pab.get(flag) is True, f"{flag} is {pab.get(flag)!r}"


def check_bucket_encryption(modules: Modules) -> None:
    storage = modules["storage"]
    sse = one_resource(storage, "aws_s3_bucket_server_side_encryption_configuration")
    assert sse["bucket"] == "${aws_s3_bucket.this.id}"
    rule = block(sse, "rule")
    default = block(rule, "apply_server_side_encryption_by_default")
    assert default["sse_algorithm"] == "aws:kms"
    assert ref(default.get("kms_master_key_id")) in module_key_refs(storage), default.get("kms_master_key_id")
    assert rule.get("bucket_key_enabled") is True
    key = resources(storage, "aws_kms_key")[ref(default["kms_master_key_id"]).split(".")[1]]
    assert key.get("deletion_window_in_days") == 30


def check_bucket_versioning(modules: Modules) -> None:
    versioning = one_resource(modules["storage"], "aws_s3_bucket_versioning")
    assert versioning["bucket"] == "${aws_s3_bucket.this.id}"
    assert block(versioning, "versioning_configuration")["status"] == "Enabled"


def check_tls_only_policy(modules: Modules) -> None:
    storage = modules["storage"]
    policy = one_resource(storage, "aws_s3_bucket_policy")
    assert policy["bucket"] == "${aws_s3_bucket.this.id}"
    guards = []
    for statement in statements(document_of(storage, policy["policy"])):
        conditions = statement.get("condition", [])
        insecure = any(
            c.get("test") == "Bool" and c.get("variable") == "aws:SecureTransport" and c.get("values") == ["false"]
            for c in conditions
        )
        if statement.get("effect") == "Deny" and insecure:
            guards.append(statement)
    assert len(guards) == 1, f"expected one Deny on aws:SecureTransport=false, found {len(guards)}"
    guard = guards[0]
    assert guard["actions"] == ["s3:*"], "the TLS guard must cover every S3 action"
    assert set(guard["resources"]) == {"${aws_s3_bucket.this.arn}", "${aws_s3_bucket.this.arn}/*"}
    assert block(guard, "principals") == {"type": "*", "identifiers": ["*"]}


def check_lifecycle(modules: Modules) -> None:
    storage = modules["storage"]
    lifecycle = one_resource(storage, "aws_s3_bucket_lifecycle_configuration")
    assert lifecycle["bucket"] == "${aws_s3_bucket.this.id}"
    rules = lifecycle.get("rule", [])
    aborting = [r for r in rules if r.get("status") == "Enabled" and "abort_incomplete_multipart_upload" in r]
    assert len(aborting) == 1, "no enabled rule aborts incomplete multipart uploads"
    assert block(aborting[0], "filter") == {}, "the abort rule must apply to the whole bucket"
    days = block(aborting[0], "abort_incomplete_multipart_upload")["days_after_initiation"]
    assert default_of(storage, days) == 7
    expiring = [r for r in rules if r.get("status") == "Enabled" and "noncurrent_version_expiration" in r]
    assert len(expiring) == 1, "no enabled rule expires noncurrent versions"
    assert default_of(storage, block(expiring[0], "noncurrent_version_expiration")["noncurrent_days"]) == 30
    dynamic_rules = [body for d in lifecycle.get("dynamic", []) for label, body in d.items() if label == "rule"]
    assert len(dynamic_rules) == 1, "one rule per infrequent-access prefix expected"
    transition = block(block(dynamic_rules[0], "content"), "transition")
    assert transition["storage_class"] == "STANDARD_IA"
    assert default_of(storage, transition["days"]) == 30
    assert "checkpoints/" in default_of(storage, "${var.infrequent_access_prefixes}")


def check_db_private_and_encrypted(modules: Modules) -> None:
    database = modules["database"]
    db = one_resource(database, "aws_db_instance")
    assert db.get("engine") == "postgres"
    assert db.get("publicly_accessible") is False
    assert db.get("storage_encrypted") is True
    assert ref(db.get("kms_key_id")) in module_key_refs(database), db.get("kms_key_id")
    assert db.get("performance_insights_enabled") is True
    assert ref(db.get("performance_insights_kms_key_id")) in module_key_refs(database)
    assert db.get("iam_database_authentication_enabled") is True
    assert default_of(database, db["engine_version"]) == "16.4"


def check_db_backups(modules: Modules) -> None:
    database = modules["database"]
    db = one_resource(database, "aws_db_instance")
    attribute = db.get("backup_retention_period")
    assert default_of(database, attribute) >= 7
    variable = variables(database)[ref(attribute).removeprefix("var.")]
    floors = [
        int(m.group(1))
        for v in variable.get("validation", [])
        for m in [re.search(r"var\.backup_retention_period\s*>=\s*(\d+)", v["condition"])]
        if m
    ]
    assert floors and min(floors) >= 7, "backup_retention_period must be validated >= 7"


def check_db_deletion_protection(modules: Modules) -> None:
    database = modules["database"]
    db = one_resource(database, "aws_db_instance")
    assert default_of(database, db.get("deletion_protection")) is True
    assert db.get("skip_final_snapshot") is False
    assert db.get("final_snapshot_identifier")


def check_db_master_password_managed(modules: Modules) -> None:
    database = modules["database"]
    db = one_resource(database, "aws_db_instance")
    assert db.get("manage_master_user_password") is True
    assert not {"password", "password_wo"} & set(db), "the master password must not be a Terraform argument"
    assert not [v for v in variables(database) if "password" in v], "no password variable"


def check_db_ingress_only_from_security_groups(modules: Modules) -> None:
    database = modules["database"]
    groups = resources(database, "aws_security_group")
    assert set(groups) == {"this"}
    assert "ingress" not in groups["this"] and "egress" not in groups["this"], "rules belong in separate resources"
    assert not resources(database, "aws_security_group_rule"), "use aws_vpc_security_group_ingress_rule"
    assert not [d for d in groups["this"].get("dynamic", []) if "ingress" in d]
    rules = resources(database, "aws_vpc_security_group_ingress_rule")
    assert rules, "no ingress rule"
    for name, rule in rules.items():
        assert rule["security_group_id"] == "${aws_security_group.this.id}", name
        assert resolve(database, rule["from_port"]) == 5432 and resolve(database, rule["to_port"]) == 5432, name
        assert rule.get("ip_protocol") == "tcp", name
        assert rule.get("referenced_security_group_id"), f"{name}: no source security group"
        assert not {"cidr_ipv4", "cidr_ipv6", "prefix_list_id", "cidr_blocks"} & set(rule), (
            f"{name}: address-range ingress"
        )
        # keys known at plan time (positions), values the security groups, which may be unknown until apply
        assert rule.get("for_each") == '${{for i, id in var.allowed_security_group_ids : "source-${i}" => id}}', name
    db = one_resource(database, "aws_db_instance")
    assert db.get("vpc_security_group_ids") == ["${aws_security_group.this.id}"]
    assert resolve(database, db.get("port")) == 5432


def check_irsa_trust(modules: Modules) -> None:
    irsa = modules["irsa"]
    role = one_resource(irsa, "aws_iam_role")
    trust = statements(document_of(irsa, role["assume_role_policy"]))
    assert len(trust) == 1
    statement = trust[0]
    assert statement.get("effect", "Allow") == "Allow"
    assert statement["actions"] == ["sts:AssumeRoleWithWebIdentity"]
    assert block(statement, "principals") == {"type": "Federated", "identifiers": ["${var.oidc_provider_arn}"]}
    conditions = {c["variable"]: c for c in statement.get("condition", [])}
    sub, aud = conditions.get("${var.oidc_provider_url}:sub"), conditions.get("${var.oidc_provider_url}:aud")
    assert sub and aud, f"trust conditions: {sorted(conditions)}"
    assert sub["test"] == "StringEquals" and aud["test"] == "StringEquals", "sub/aud must match exactly (no StringLike)"
    assert [resolve(irsa, v) for v in sub["values"]] == [
        "system:serviceaccount:${var.namespace}:${var.service_account}"
    ]
    assert aud["values"] == ["sts.amazonaws.com"]


def check_irsa_least_privilege(modules: Modules) -> None:
    irsa = modules["irsa"]
    policy = one_resource(irsa, "aws_iam_role_policy")
    assert policy["role"] == "${aws_iam_role.this.id}"
    by_sid = {s.get("sid"): s for s in statements(document_of(irsa, policy["policy"]))}
    listing = by_sid["ListArtifactPrefixes"]
    assert listing["actions"] == ["s3:ListBucket"] and listing["resources"] == ["${var.bucket_arn}"]
    prefix = [c for c in listing.get("condition", []) if c["variable"] == "s3:prefix"]
    assert prefix and "var.bucket_prefixes" in resolve(irsa, prefix[0]["values"]), (
        "ListBucket must be limited by s3:prefix"
    )
    objects = by_sid["ReadWriteArtifacts"]
    assert set(objects["actions"]) == {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"}
    object_arns = resolve(irsa, objects["resources"])  # a for expression over var.bucket_prefixes
    assert isinstance(object_arns, str) and re.search(r'"\$\{var\.bucket_arn\}/\$\{p\}/\*"', object_arns), (
        "objects only under the prefixes"
    )
    kms = by_sid["UseArtifactKeyThroughS3"]
    assert set(kms["actions"]) == {"kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"}
    assert kms["resources"] == ["${var.kms_key_arn}"]
    secret = by_sid["ReadDatabaseSecret"]
    assert secret["resources"] == ["${statement.value}"] and all(
        a.startswith("secretsmanager:") for a in secret["actions"]
    )


def _wildcard_action(action: Any) -> bool:
    return not isinstance(action, str) or "*" in action


def _wildcard_resource(mod: dict, resource: Any) -> bool:
    resource = resolve(mod, resource)
    if not isinstance(resource, str) or resource.strip() in {"*", '"*"'}:
        return True
    if re.search(r'"\*"|\[\s*"\*"', resource):  # a literal "*" inside an expression
        return True
    if not resource.startswith("${"):  # a literal ARN would be outside the module's own resources
        return True
    # After the leading reference, only a key-prefix tail (".../*") may hold a wildcard.
    return "*" in resource.split("}", 1)[0]


def check_no_wildcard_iam(modules: Modules) -> None:
    seen = 0
    for name, mod in modules.items():
        for item in mod.get("resource", []):
            for _type, named in item.items():
                for _name, body in named.items():
                    for attribute in ("policy", "assume_role_policy", "inline_policy"):
                        if attribute in body:
                            document_of(mod, body[attribute])  # raw JSON policies would escape this check
        for doc_name, document in policy_documents(mod).items():
            assert not {"source_policy_documents", "override_policy_documents"} & set(document), (
                f"{name}.{doc_name}: merged JSON"
            )
            for statement in statements(document):
                seen += 1
                where = f"{name}.{doc_name}.{statement.get('sid', '?')}"
                assert "not_actions" not in statement and "not_resources" not in statement, (
                    f"{where}: NotAction/NotResource"
                )
                actions = literal_list(mod, statement.get("actions"))
                assert actions, f"{where}: no actions"
                if statement.get("effect", "Allow") == "Deny":
                    # A deny may cover a whole service: the bucket's TLS guards deny s3:* over bad transport.
                    assert all(a != "*" for a in actions), f"{where}: Deny on every service"
                    assert statement.get("condition"), f"{where}: unconditional wildcard deny"
                else:
                    wild = [a for a in actions if _wildcard_action(a)]
                    assert not wild, f"{where}: wildcard actions {wild}"
                if "resources" in statement:
                    value = resolve(mod, statement["resources"])
                    items = value if isinstance(value, list) else [value]
                    bad = [r for r in items if _wildcard_resource(mod, r)]
                    assert not bad, f"{where}: wildcard or unanchored resources {bad}"
                else:  # only a role's trust policy names no resources: it must be an sts: grant to a principal
                    assert statement.get("principals") and all(a.startswith("sts:") for a in actions), (
                        f"{where}: no resources"
                    )
    assert seen >= 8, f"only {seen} IAM statements found"
    # The IRSA role's own statements: no Deny carve-outs there, so no wildcard of any kind.
    for document in policy_documents(modules["irsa"]).values():
        for statement in statements(document):
            assert statement.get("effect", "Allow") == "Allow"
            assert not [a for a in literal_list(modules["irsa"], statement["actions"]) if _wildcard_action(a)]


CHECKS: dict[str, Callable[[Modules], None]] = {
    "variables_documented": check_variables_documented,
    "versions_and_no_providers": check_versions_and_no_providers,
    "public_access_block": check_public_access_block,
    "bucket_encryption": check_bucket_encryption,
    "bucket_versioning": check_bucket_versioning,
    "tls_only_policy": check_tls_only_policy,
    "lifecycle": check_lifecycle,
    "db_private_and_encrypted": check_db_private_and_encrypted,
    "db_backups": check_db_backups,
    "db_deletion_protection": check_db_deletion_protection,
    "db_master_password_managed": check_db_master_password_managed,
    "db_ingress_only_from_security_groups": check_db_ingress_only_from_security_groups,
    "irsa_trust": check_irsa_trust,
    "irsa_least_privilege": check_irsa_least_privilege,
    "no_wildcard_iam": check_no_wildcard_iam,
}


@pytest.mark.parametrize("check", CHECKS)
def test_properties(modules: Modules, check: str) -> None:
    CHECKS[check](modules)


# -- each check must be able to fail -------------------------------------------------------------


def _res(m: Modules, module: str, type_: str, name: str = "this") -> dict:
    return resources(m[module], type_)[name]


def _doc(m: Modules, module: str, name: str) -> dict:
    return policy_documents(m[module])[name]


def _var(m: Modules, module: str, name: str) -> dict:
    return variables(m[module])[name]


def _sid(m: Modules, module: str, doc: str, sid: str) -> dict:
    return next(s for s in statements(_doc(m, module, doc)) if s.get("sid") == sid)


def _lifecycle_rule(m: Modules, rule_id: str) -> dict:
    return next(r for r in _res(m, "storage", "aws_s3_bucket_lifecycle_configuration")["rule"] if r["id"] == rule_id)


def _ingress(m: Modules) -> dict:
    return _res(m, "database", "aws_vpc_security_group_ingress_rule", "postgres")


MUTATIONS: list[tuple[str, str, Callable[[Modules], Any]]] = [
    ("variables_documented", "description dropped", lambda m: _var(m, "database", "multi_az").pop("description")),
    ("variables_documented", "type dropped", lambda m: _var(m, "irsa", "bucket_prefixes").pop("type")),
    (
        "versions_and_no_providers",
        "provider configured",
        lambda m: m["storage"].setdefault("provider", [{"aws": {"region": "x"}}]),
    ),
    (
        "versions_and_no_providers",
        "provider unpinned",
        lambda m: block(m["irsa"]["terraform"][0], "required_providers")["aws"].update(version=">= 4"),
    ),
    (
        "public_access_block",
        "ignore_public_acls false",
        lambda m: _res(m, "storage", "aws_s3_bucket_public_access_block").update(ignore_public_acls=False),
    ),
    (
        "public_access_block",
        "restrict_public_buckets missing",
        lambda m: _res(m, "storage", "aws_s3_bucket_public_access_block").pop("restrict_public_buckets"),
    ),
    (
        "bucket_encryption",
        "SSE-S3",
        lambda m: block(
            block(_res(m, "storage", "aws_s3_bucket_server_side_encryption_configuration"), "rule"),
            "apply_server_side_encryption_by_default",
        ).update(sse_algorithm="AES256"),
    ),
    (
        "bucket_encryption",
        "aws-managed key",
        lambda m: block(
            block(_res(m, "storage", "aws_s3_bucket_server_side_encryption_configuration"), "rule"),
            "apply_server_side_encryption_by_default",
        ).update(kms_master_key_id="alias/aws/s3"),
    ),
    (
        "bucket_encryption",
        "key rotation off",
        lambda m: _res(m, "storage", "aws_kms_key").update(enable_key_rotation=False),
    ),
    (
        "bucket_encryption",
        "no bucket key",
        lambda m: block(_res(m, "storage", "aws_s3_bucket_server_side_encryption_configuration"), "rule").update(
            bucket_key_enabled=False
        ),
    ),
    (
        "bucket_versioning",
        "suspended",
        lambda m: block(_res(m, "storage", "aws_s3_bucket_versioning"), "versioning_configuration").update(
            status="Suspended"
        ),
    ),
    (
        "tls_only_policy",
        "guard allows",
        lambda m: _sid(m, "storage", "bucket", "DenyInsecureTransport").update(effect="Allow"),
    ),
    (
        "tls_only_policy",
        "guard condition inverted",
        lambda m: _sid(m, "storage", "bucket", "DenyInsecureTransport")["condition"][0].update(values=["true"]),
    ),
    (
        "tls_only_policy",
        "guard on objects only",
        lambda m: _sid(m, "storage", "bucket", "DenyInsecureTransport").update(
            resources=["${aws_s3_bucket.this.arn}/*"]
        ),
    ),
    (
        "lifecycle",
        "abort rule removed",
        lambda m: _lifecycle_rule(m, "abort-incomplete-multipart-uploads").pop("abort_incomplete_multipart_upload"),
    ),
    (
        "lifecycle",
        "abort rule disabled",
        lambda m: _lifecycle_rule(m, "abort-incomplete-multipart-uploads").update(status="Disabled"),
    ),
    (
        "lifecycle",
        "abort after 30 days",
        lambda m: _var(m, "storage", "abort_incomplete_multipart_upload_days").update(default=30),
    ),
    (
        "lifecycle",
        "transition to glacier",
        lambda m: block(
            block(
                next(
                    d["rule"]
                    for d in _res(m, "storage", "aws_s3_bucket_lifecycle_configuration")["dynamic"]
                    if "rule" in d
                ),
                "content",
            ),
            "transition",
        ).update(storage_class="GLACIER"),
    ),
    (
        "db_private_and_encrypted",
        "public",
        lambda m: _res(m, "database", "aws_db_instance").update(publicly_accessible=True),
    ),
    (
        "db_private_and_encrypted",
        "unencrypted",
        lambda m: _res(m, "database", "aws_db_instance").update(storage_encrypted=False),
    ),
    ("db_private_and_encrypted", "aws-managed key", lambda m: _res(m, "database", "aws_db_instance").pop("kms_key_id")),
    (
        "db_private_and_encrypted",
        "insights unencrypted",
        lambda m: _res(m, "database", "aws_db_instance").pop("performance_insights_kms_key_id"),
    ),
    (
        "db_private_and_encrypted",
        "no IAM auth",
        lambda m: _res(m, "database", "aws_db_instance").update(iam_database_authentication_enabled=False),
    ),
    (
        "db_private_and_encrypted",
        "engine unpinned",
        lambda m: _var(m, "database", "engine_version").update(default="16"),
    ),
    ("db_backups", "default 3 days", lambda m: _var(m, "database", "backup_retention_period").update(default=3)),
    (
        "db_backups",
        "validation lowered",
        lambda m: _var(m, "database", "backup_retention_period")["validation"][0].update(
            condition="${var.backup_retention_period >= 1}"
        ),
    ),
    ("db_backups", "validation removed", lambda m: _var(m, "database", "backup_retention_period").pop("validation")),
    (
        "db_deletion_protection",
        "default off",
        lambda m: _var(m, "database", "deletion_protection").update(default=False),
    ),
    (
        "db_deletion_protection",
        "hard-coded off",
        lambda m: _res(m, "database", "aws_db_instance").update(deletion_protection=False),
    ),
    (
        "db_deletion_protection",
        "unnamed final snapshot",
        lambda m: _res(m, "database", "aws_db_instance").pop("final_snapshot_identifier"),
    ),
    (
        "db_deletion_protection",
        "no final snapshot",
        lambda m: _res(m, "database", "aws_db_instance").update(skip_final_snapshot=True),
    ),
    (
        "db_master_password_managed",
        "password argument",
        lambda m: _res(m, "database", "aws_db_instance").update(password="${var.password}"),
    ),
    (
        "db_master_password_managed",
        "not managed",
        lambda m: _res(m, "database", "aws_db_instance").update(manage_master_user_password=False),
    ),
    ("db_ingress_only_from_security_groups", "CIDR ingress", lambda m: _ingress(m).update(cidr_ipv4="10.0.0.0/8")),
    ("db_ingress_only_from_security_groups", "port range", lambda m: _ingress(m).update(to_port=65535)),
    (
        "db_ingress_only_from_security_groups",
        "inline ingress",
        lambda m: _res(m, "database", "aws_security_group").update(
            ingress=[{"from_port": 5432, "cidr_blocks": ["0.0.0.0/0"]}]
        ),
    ),
    ("db_ingress_only_from_security_groups", "any protocol", lambda m: _ingress(m).update(ip_protocol="-1")),
    (
        "db_ingress_only_from_security_groups",
        "extra security group on the instance",
        lambda m: _res(m, "database", "aws_db_instance")["vpc_security_group_ids"].append("${var.extra_sg}"),
    ),
    (
        "db_ingress_only_from_security_groups",
        "legacy rule resource",
        lambda m: m["database"]["resource"].append(
            {"aws_security_group_rule": {"open": {"type": "ingress", "cidr_blocks": ["0.0.0.0/0"]}}}
        ),
    ),
    (
        "irsa_trust",
        "sub not pinned",
        lambda m: _sid(m, "irsa", "trust", "ServiceAccountWebIdentity")["condition"].pop(0),
    ),
    (
        "irsa_trust",
        "sub StringLike",
        lambda m: _sid(m, "irsa", "trust", "ServiceAccountWebIdentity")["condition"][0].update(test="StringLike"),
    ),
    (
        "irsa_trust",
        "any service account",
        lambda m: m["irsa"]["locals"][0].update(subject="system:serviceaccount:${var.namespace}:*"),
    ),
    (
        "irsa_trust",
        "aud wrong",
        lambda m: _sid(m, "irsa", "trust", "ServiceAccountWebIdentity")["condition"][1].update(values=["*"]),
    ),
    (
        "irsa_least_privilege",
        "listing unrestricted",
        lambda m: _sid(m, "irsa", "access", "ListArtifactPrefixes").pop("condition"),
    ),
    (
        "irsa_least_privilege",
        "whole bucket objects",
        lambda m: _sid(m, "irsa", "access", "ReadWriteArtifacts").update(resources=["${var.bucket_arn}/*"]),
    ),
    (
        "irsa_least_privilege",
        "extra action",
        lambda m: _sid(m, "irsa", "access", "ReadWriteArtifacts")["actions"].append("s3:PutObjectAcl"),
    ),
    (
        "no_wildcard_iam",
        "s3:* allowed",
        lambda m: _sid(m, "irsa", "access", "ReadWriteArtifacts").update(actions=["s3:*"]),
    ),
    (
        "no_wildcard_iam",
        "* action",
        lambda m: _sid(m, "irsa", "access", "UseArtifactKeyThroughS3")["actions"].append("*"),
    ),
    (
        "no_wildcard_iam",
        "prefix wildcard action",
        lambda m: _sid(m, "irsa", "access", "ReadDatabaseSecret")["actions"].append("secretsmanager:Get*"),
    ),
    (
        "no_wildcard_iam",
        "* resource",
        lambda m: _sid(m, "irsa", "access", "UseArtifactKeyThroughS3").update(resources=["*"]),
    ),
    (
        "no_wildcard_iam",
        "* resource through a local",
        lambda m: m["irsa"]["locals"][0].update(object_resources='${["*"]}'),
    ),
    (
        "no_wildcard_iam",
        "wildcard ARN",
        lambda m: _sid(m, "irsa", "access", "ReadDatabaseSecret").update(
            resources=["arn:aws:secretsmanager:*:*:secret:*"]
        ),
    ),
    (
        "no_wildcard_iam",
        "deny on every service",
        lambda m: _sid(m, "storage", "bucket", "DenyOutdatedTls").update(actions=["*"]),
    ),
    (
        "no_wildcard_iam",
        "unconditional wildcard deny",
        lambda m: _sid(m, "storage", "bucket", "DenyOutdatedTls").pop("condition"),
    ),
    (
        "no_wildcard_iam",
        "NotAction",
        lambda m: _sid(m, "irsa", "access", "ReadWriteArtifacts").update(not_actions=["iam:PassRole"]),
    ),
    (
        "no_wildcard_iam",
        "raw JSON policy",
        lambda m: _res(m, "storage", "aws_s3_bucket_policy").update(policy="${jsonencode({Statement = []})}"),
    ),
    (
        "no_wildcard_iam",
        "monitoring role s3:*",
        lambda m: _doc(m, "database", "monitoring_trust")["statement"][0].update(actions=["s3:*"]),
    ),
]


@pytest.mark.parametrize(
    "check,mutate", [(c, f) for c, _, f in MUTATIONS], ids=[f"{c}-{d.replace(' ', '_')}" for c, d, _ in MUTATIONS]
)
def test_check_catches(modules: Modules, check: str, mutate: Callable[[Modules], Any]) -> None:
    broken = copy.deepcopy(modules)
    mutate(broken)
    with pytest.raises(AssertionError):
        CHECKS[check](broken)


def test_every_check_has_a_mutation() -> None:
    assert set(CHECKS) == {c for c, _, _ in MUTATIONS}
