"""apps.encryption.crypto: AES-256-GCM envelopes bound to purpose and row id, and the MEMORY_ENCRYPTION_KEYS key ring."""

from __future__ import annotations

import base64

import pytest
from django.core.exceptions import ImproperlyConfigured

from apps.encryption import crypto

K1 = base64.b64encode(b"\x01" * 32).decode()
K2 = base64.b64encode(b"\x02" * 32).decode()


@pytest.fixture
def ring(settings):
    settings.MEMORY_ENCRYPTION_KEYS = f"k1:{K1}"
    return settings


def test_round_trip(ring):
    blob = crypto.encrypt(b"secret value", purpose="memory.value", row_id="row-1")
    assert b"secret value" not in blob
    assert crypto.decrypt(blob, purpose="memory.value", row_id="row-1") == b"secret value"


def test_round_trip_empty_and_json(ring):
    assert crypto.decrypt(crypto.encrypt(b"", purpose="p", row_id="r"), purpose="p", row_id="r") == b""
    value = {"text": "héllo", "n": [1, 2.5, None, True], "nested": {"a": "b"}}
    blob = crypto.encrypt_json(value, purpose="memory.value", row_id="r")
    assert crypto.decrypt_json(blob, purpose="memory.value", row_id="r") == value


def test_json_is_compact(ring, monkeypatch):
    seen = []
    real = crypto.encrypt
    monkeypatch.setattr(crypto, "encrypt", lambda data, **kw: seen.append(data) or real(data, **kw))
    crypto.encrypt_json({"a": 1, "b": "é"}, purpose="p", row_id="r")
    assert seen == ['{"a":1,"b":"é"}'.encode()]


def test_envelope_header_carries_version_and_key_id(ring):
    blob = crypto.encrypt(b"x", purpose="p", row_id="r")
    assert blob.startswith(b"MS\x01\x02k1")
    assert crypto.key_id_of(blob) == "k1"
    assert crypto.header_for("k1") == blob[:6]
    # header + 12-byte nonce + ciphertext (1 byte) + 16-byte tag
    assert len(blob) == 6 + 12 + 1 + 16


@pytest.mark.parametrize(
    ("purpose", "row_id"),
    [("memory.value", "row-2"), ("event.value", "row-1"), ("memory.valu", "erow-1")],
)
def test_associated_data_binds_purpose_and_row(ring, purpose, row_id):
    blob = crypto.encrypt(b"secret", purpose="memory.value", row_id="row-1")
    with pytest.raises(crypto.DecryptionError):
        crypto.decrypt(blob, purpose=purpose, row_id=row_id)


def test_uuid_row_ids_are_accepted_as_text(ring):
    import uuid

    row = uuid.uuid4()
    blob = crypto.encrypt(b"v", purpose="p", row_id=str(row))
    assert crypto.decrypt(blob, purpose="p", row_id=row) == b"v"  # str() applied on both sides


@pytest.mark.parametrize("position", [0, 2, 4, 6, 10, -1, -20])
def test_tampering_anywhere_fails(ring, position):
    blob = bytearray(crypto.encrypt(b"some plaintext", purpose="p", row_id="r"))
    blob[position] ^= 0x01
    with pytest.raises(crypto.DecryptionError):
        crypto.decrypt(bytes(blob), purpose="p", row_id="r")


def test_header_key_id_swap_fails_even_with_both_keys(settings):
    settings.MEMORY_ENCRYPTION_KEYS = f"k1:{K1},k2:{K2}"
    blob = crypto.encrypt(b"v", purpose="p", row_id="r")
    forged = crypto.header_for("k2") + blob[len(crypto.header_for("k1")) :]
    with pytest.raises(crypto.DecryptionError):
        crypto.decrypt(forged, purpose="p", row_id="r")


@pytest.mark.parametrize(
    "blob", [b"", b"MS", b"XX\x01\x02k1" + b"\0" * 40, b"MS\x02\x02k1" + b"\0" * 40, b"MS\x01\x02k1short"]
)
def test_malformed_envelopes(ring, blob):
    with pytest.raises(crypto.DecryptionError):
        crypto.decrypt(blob, purpose="p", row_id="r")


def test_truncated_ciphertext_fails(ring):
    blob = crypto.encrypt(b"plaintext", purpose="p", row_id="r")
    with pytest.raises(crypto.DecryptionError):
        crypto.decrypt(blob[:-1], purpose="p", row_id="r")


def test_memoryview_from_bytea_is_accepted(ring):
    blob = crypto.encrypt(b"v", purpose="p", row_id="r")
    assert crypto.decrypt(memoryview(blob), purpose="p", row_id="r") == b"v"
    assert crypto.key_id_of(memoryview(blob)) == "k1"


def test_nonces_are_unique(ring):
    header_len = len(crypto.header_for("k1"))
    blobs = [crypto.encrypt(b"same", purpose="p", row_id="r") for _ in range(2000)]
    nonces = {blob[header_len : header_len + 12] for blob in blobs}
    assert len(nonces) == len(blobs)
    assert len({bytes(b) for b in blobs}) == len(blobs)


def test_key_rotation_ring(settings):
    settings.MEMORY_ENCRYPTION_KEYS = f"k1:{K1}"
    old = crypto.encrypt(b"old", purpose="p", row_id="r")
    settings.MEMORY_ENCRYPTION_KEYS = f"k2:{K2},k1:{K1}"
    assert crypto.primary_key_id() == "k2"
    assert crypto.decrypt(old, purpose="p", row_id="r") == b"old"
    new = crypto.encrypt(b"new", purpose="p", row_id="r")
    assert crypto.key_id_of(old) == "k1"
    assert crypto.key_id_of(new) == "k2"
    settings.MEMORY_ENCRYPTION_KEYS = f"k2:{K2}"  # k1 retired
    with pytest.raises(crypto.DecryptionError, match="unknown encryption key id 'k1'"):
        crypto.decrypt(old, purpose="p", row_id="r")
    assert crypto.decrypt(new, purpose="p", row_id="r") == b"new"


def test_same_kid_with_another_key_does_not_decrypt(settings):
    settings.MEMORY_ENCRYPTION_KEYS = f"k1:{K1}"
    blob = crypto.encrypt(b"v", purpose="p", row_id="r")
    settings.MEMORY_ENCRYPTION_KEYS = f"k1:{K2}"
    with pytest.raises(crypto.DecryptionError):
        crypto.decrypt(blob, purpose="p", row_id="r")


def test_urlsafe_and_unpadded_keys_are_accepted(settings):
    raw = bytes(range(250, 256)) * 5 + b"\xfb\xff"
    urlsafe = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    settings.MEMORY_ENCRYPTION_KEYS = f" k-1.a_b : {urlsafe} , "
    assert crypto.primary_key_id() == "k-1.a_b"
    assert crypto.decrypt(crypto.encrypt(b"v", purpose="p", row_id="r"), purpose="p", row_id="r") == b"v"


SHORT = base64.b64encode(b"\x03" * 16).decode()
LONG = base64.b64encode(b"\x04" * 48).decode()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "is empty"),
        (" , ", "is empty"),
        (f"k1:{SHORT}", "16 bytes"),
        (f"k1:{LONG}", "48 bytes"),
        ("k1:not*base64!", "not valid base64"),
        (f":{K1}", "key id"),
        (f"bad kid:{K1}", "key id"),
        (K1, "no ':'"),
        (f"k1:{K1},k1:{K2}", "appears twice"),
        (f"k1:{K1},k2:{SHORT}", "entry #2"),
    ],
)
def test_malformed_keys_setting(settings, value, message):
    settings.MEMORY_ENCRYPTION_KEYS = value
    with pytest.raises(ImproperlyConfigured, match=message) as info:
        crypto.encrypt(b"v", purpose="p", row_id="r")
    text = str(info.value)
    for secret in (K1, K2, SHORT, LONG, "not*base64!"):
        assert secret not in text


def test_check_configuration_validates_early(settings):
    settings.MEMORY_ENCRYPTION_KEYS = f"k1:{SHORT}"
    with pytest.raises(ImproperlyConfigured):
        crypto.check_configuration()
    settings.MEMORY_ENCRYPTION_KEYS = f"k1:{K1}"
    crypto.check_configuration()


def test_keyring_is_cached_until_the_setting_changes(settings):
    settings.MEMORY_ENCRYPTION_KEYS = f"k1:{K1}"
    assert crypto.keyring() is crypto.keyring()
    first = crypto.keyring()
    settings.MEMORY_ENCRYPTION_KEYS = f"k2:{K2}"
    assert crypto.keyring() is not first
    assert crypto.primary_key_id() == "k2"


def test_empty_purpose_is_refused(ring):
    with pytest.raises(ValueError):
        crypto.encrypt(b"v", purpose="", row_id="r")


def test_registry():
    crypto.register_encrypted_field("memories.Thing", "value_enc", "memory.value")
    crypto.register_encrypted_field("memories.Thing", "value_enc", "memory.value")  # idempotent
    try:
        specs = [s for s in crypto.encrypted_fields() if s.model_label == "memories.Thing"]
        assert specs == [crypto.EncryptedField("memories.Thing", "value_enc", "memory.value", "pk")]
    finally:
        crypto.unregister_encrypted_field("memories.Thing", "value_enc")
    assert not [s for s in crypto.encrypted_fields() if s.model_label == "memories.Thing"]


def test_embedded_settings_generate_a_key_file_once(tmp_path, monkeypatch):
    """config/settings/embedded.py: an empty MEMORY_ENCRYPTION_KEYS means a key file in DATA_DIR, made once, 0600
    (config.local_secrets, where generating is allowed: the embedded database)."""
    from config import local_secrets

    monkeypatch.delenv("MEMORY_ENCRYPTION_KEYS", raising=False)
    path = tmp_path / "data" / "encryption-keys"
    sources: dict[str, str] = {}

    def resolve() -> str:
        return local_secrets.resolve(
            "MEMORY_ENCRYPTION_KEYS", path, local_secrets.new_encryption_keys, generate=True, sources=sources, hint=""
        )

    first = resolve()
    assert sources == {"MEMORY_ENCRYPTION_KEYS": f"generated {path}"}
    assert resolve() == first
    assert sources == {"MEMORY_ENCRYPTION_KEYS": f"file {path}"}
    assert crypto.parse_keyring(first).primary.startswith("local-")
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["encryption-keys"]  # the temporary file is gone


# --- manage.py rotate_encryption_key ------------------------------------------------------------------------------
# Exercised on a throwaway model whose table lives only inside the test's transaction (no migration in the project).


@pytest.fixture
def probe_model(db):
    import uuid

    from django.apps import apps
    from django.db import connection, models

    class RotationProbe(models.Model):
        id = models.UUIDField(primary_key=True, default=uuid.uuid4)
        secret = models.BinaryField(null=True)

        class Meta:
            app_label = "core"
            db_table = "test_rotation_probe"

        def __str__(self) -> str:
            return str(self.id)

    with connection.schema_editor() as editor:
        editor.create_model(RotationProbe)
    crypto.register_encrypted_field("core.RotationProbe", "secret", "test.secret")
    try:
        yield RotationProbe
    finally:
        crypto.unregister_encrypted_field("core.RotationProbe", "secret")
        del apps.all_models["core"]["rotationprobe"]
        apps.clear_cache()


def _rotate(**options):
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    options.setdefault("no_progress", True)
    call_command("rotate_encryption_key", stdout=out, **options)
    return out.getvalue()


@pytest.mark.usefixtures("own_key_rings")
def test_rotate_encryption_key(settings, probe_model):
    import uuid

    settings.MEMORY_ENCRYPTION_KEYS = f"k1:{K1}"
    ids = [uuid.uuid4() for _ in range(7)]
    for n, row_id in enumerate(ids):
        probe_model.objects.create(
            id=row_id, secret=crypto.encrypt(f"v{n}".encode(), purpose="test.secret", row_id=str(row_id))
        )
    probe_model.objects.create(secret=None)

    settings.MEMORY_ENCRYPTION_KEYS = f"k2:{K2},k1:{K1}"
    already = uuid.uuid4()
    current = crypto.encrypt(b"current", purpose="test.secret", row_id=str(already))
    probe_model.objects.create(id=already, secret=current)

    assert "core.RotationProbe.secret: 7 value(s) to re-encrypt" in _rotate(dry_run=True)

    output = _rotate(batch_size=3, no_progress=False)
    assert "core.RotationProbe.secret: rotated 7, already current 0, failed 0, remaining 0" in output
    for n, row_id in enumerate(ids):
        blob = bytes(probe_model.objects.get(id=row_id).secret)
        assert crypto.key_id_of(blob) == "k2"
        assert crypto.decrypt(blob, purpose="test.secret", row_id=str(row_id)) == f"v{n}".encode()
    assert bytes(probe_model.objects.get(id=already).secret) == current  # rows under the primary are not touched

    # Resumable / idempotent: a second run finds nothing left, and k1 can now be retired.
    assert "rotated 0, already current 0, failed 0, remaining 0" in _rotate()
    settings.MEMORY_ENCRYPTION_KEYS = f"k2:{K2}"
    assert crypto.decrypt(bytes(probe_model.objects.get(id=ids[0]).secret), purpose="test.secret", row_id=str(ids[0]))


@pytest.mark.usefixtures("own_key_rings")
def test_rotate_encryption_key_reports_undecryptable_rows(settings, probe_model):
    from django.core.management.base import CommandError

    settings.MEMORY_ENCRYPTION_KEYS = f"k1:{K1}"
    good = probe_model.objects.create()
    good.secret = crypto.encrypt(b"good", purpose="test.secret", row_id=str(good.id))
    good.save()
    moved = probe_model.objects.create()
    moved.secret = crypto.encrypt(b"copied from another row", purpose="test.secret", row_id="another-row")
    moved.save()

    settings.MEMORY_ENCRYPTION_KEYS = f"k2:{K2},k1:{K1}"
    with pytest.raises(CommandError, match="1 value"):
        _rotate()
    assert crypto.key_id_of(bytes(probe_model.objects.get(id=good.id).secret)) == "k2"
    assert crypto.key_id_of(bytes(probe_model.objects.get(id=moved.id).secret)) == "k1"


@pytest.mark.usefixtures("own_key_rings")
def test_rotate_encryption_key_without_registered_columns(settings):
    settings.MEMORY_ENCRYPTION_KEYS = f"k1:{K1}"
    saved = crypto.encrypted_fields()
    saved_rotators = crypto.blob_rotators()
    for spec in saved:
        crypto.unregister_encrypted_field(spec.model_label, spec.field)
    for rotator in saved_rotators:
        crypto.unregister_blob_rotator(rotator.label)
    try:
        assert "nothing to do" in _rotate()
    finally:
        for spec in saved:
            crypto.register_encrypted_field(spec.model_label, spec.field, spec.purpose, spec.row_id_field)
        for rotator in saved_rotators:
            crypto.register_blob_rotator(rotator)
