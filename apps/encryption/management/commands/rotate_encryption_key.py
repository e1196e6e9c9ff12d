"""`manage.py rotate_encryption_key`: re-encrypt every registered encrypted column, and every registered set of
encrypted files (attachment blobs, see ``crypto.register_blob_rotator``), under the current primary key (D4).

Rotation in two phases (README "Key rotation"): add the new key at the end of MEMORY_ENCRYPTION_KEYS on every host
(it decrypts only) and restart them; then move it first on every host (it encrypts), restart, and run this command.
It refuses to run while some live host (apps.encryption.key_rings) lacks the primary, since a value re-encrypted under it
would be lost to that host. It is safe while the service serves and resumable:

* only rows whose envelope header names another key are selected (compared in SQL on the clear header bytes), so a
  re-run continues with what is left;
* each batch is its own short transaction, rows taken in primary-key order with ``FOR UPDATE SKIP LOCKED``: a row a
  live request holds is skipped (and reported as remaining) instead of blocking either side, and a locked row cannot
  change between our read and our write;
* the update touches only the encrypted column (no save(), no signals, no auto_now bumps).

Files are re-sealed one at a time (streamed, bounded memory), each replacing the old one atomically; a file whose
row is locked by a delete or the expiry sweep is skipped and reported as remaining. A file's key id is read from its
clear header, so a re-run also continues where one stopped.

Remove an old key from the ring only once the summary reports nothing remaining.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import models, transaction
from django.db.models.functions import Substr
from tqdm import tqdm

from apps.encryption import crypto


@dataclass
class _Tally:
    label: str
    rotated: int = 0
    already_primary: int = 0
    failed: int = 0
    failed_examples: list[str] = field(default_factory=list)
    remaining: int = 0


class Command(BaseCommand):
    help = "Re-encrypt every registered encrypted column under the primary key of MEMORY_ENCRYPTION_KEYS."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=500, help="rows per transaction (default 500)")
        parser.add_argument("--dry-run", action="store_true", help="only count the rows that need re-encryption")
        parser.add_argument("--no-progress", action="store_true", help="do not draw progress bars")

    def handle(self, *args: Any, batch_size: int, dry_run: bool, no_progress: bool, **options: Any) -> None:
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        primary = crypto.primary_key_id()  # also validates the key ring before touching anything
        self._check_hosts(primary)
        specs = crypto.encrypted_fields()
        rotators = crypto.blob_rotators()
        if not specs and not rotators:
            self.stdout.write("No encrypted columns or files are registered; nothing to do.")
            return
        self.stdout.write(f"Primary key id: {primary}")

        tallies: list[_Tally] = []
        for spec in specs:
            pending = self._pending(spec, primary)
            if dry_run:
                self.stdout.write(f"{spec.model_label}.{spec.field}: {pending.count()} value(s) to re-encrypt")
                continue
            tallies.append(self._rotate(spec, primary, pending, batch_size, no_progress))
        for rotator in rotators:
            tallies.append(self._rotate_blobs(rotator, primary, dry_run, no_progress))

        if dry_run:
            return
        self.stdout.write("Summary:")
        failed = remaining = 0
        for tally in tallies:
            self.stdout.write(
                f"  {tally.label}: rotated {tally.rotated}, already current {tally.already_primary}, "
                f"failed {tally.failed}, remaining {tally.remaining}"
            )
            if tally.failed_examples:
                self.stdout.write(f"    could not decrypt (first ids): {', '.join(tally.failed_examples)}")
            failed += tally.failed
            remaining += tally.remaining
        if failed:
            raise CommandError(f"{failed} value(s) could not be decrypted with any key of the ring; see above.")
        if remaining:
            self.stdout.write(f"{remaining} value(s) were locked by live requests or written meanwhile; run again.")
        else:
            self.stdout.write(self.style.SUCCESS("Every registered value is under the primary key."))

    def _check_hosts(self, primary: str) -> None:
        """Promote only a key every live host holds (apps.encryption.key_rings): a value re-sealed under a key some host
        lacks is a value that host can no longer read. Refused with the hosts to fix first."""
        from apps.encryption import key_rings

        status = key_rings.assess()
        if status.conflicting:
            raise CommandError(
                f"key id(s) {', '.join(status.conflicting)} of this MEMORY_ENCRYPTION_KEYS have other key bytes on "
                "live hosts: give every host the same list."
            )
        if status.lacking:
            lacking = "; ".join(f"{kid} (written by {', '.join(hosts)})" for kid, hosts in status.lacking.items())
            raise CommandError(
                f"this MEMORY_ENCRYPTION_KEYS lacks keys live hosts encrypt with: {lacking}. Run the command with the "
                "ring the hosts use."
            )
        if status.primary_lacking_on:
            raise CommandError(
                f"the primary key {primary!r} is not in MEMORY_ENCRYPTION_KEYS on every live host: "
                f"{', '.join(status.primary_lacking_on)} lack(s) it and could not read values re-encrypted under it. "
                'Add it there first (phase 1 of a rotation: README "Key rotation"), restart them, and run this '
                "again."
            )
        self.stdout.write(f"Every live host ({status.live_rings} key ring(s) reported) holds {primary}.")

    def _pending(self, spec: crypto.EncryptedField, primary: str) -> models.QuerySet:
        """Rows of ``spec`` whose envelope does not start with the primary key's header."""
        try:
            model = apps.get_model(spec.model_label)
        except LookupError as exc:
            raise CommandError(f"registered encrypted column {spec.model_label}.{spec.field}: {exc}") from exc
        header = crypto.header_for(primary)
        return (
            model._default_manager.exclude(**{f"{spec.field}__isnull": True})
            .annotate(_envelope_header=Substr(spec.field, 1, len(header), output_field=models.BinaryField()))
            .exclude(_envelope_header=header)
        )

    def _rotate(
        self, spec: crypto.EncryptedField, primary: str, pending: models.QuerySet, batch_size: int, no_progress: bool
    ) -> _Tally:
        model = pending.model
        label = f"{spec.model_label}.{spec.field}"
        tally = _Tally(label)
        columns = [spec.field, *(name for name in spec.row_id_field.split(",") if name != "pk")]
        last_pk = None
        with tqdm(total=pending.count(), desc=label, unit="value", file=sys.stderr, disable=no_progress) as bar:
            while True:
                with transaction.atomic():
                    batch_qs = pending.order_by("pk")
                    if last_pk is not None:
                        batch_qs = batch_qs.filter(pk__gt=last_pk)
                    rows = list(batch_qs.select_for_update(skip_locked=True).only(*columns)[:batch_size])
                    if not rows:
                        break
                    changed = []
                    for row in rows:
                        if self._reencrypt(spec, primary, row, tally):
                            changed.append(row)
                    if changed:
                        model._default_manager.bulk_update(changed, [spec.field])
                last_pk = rows[-1].pk
                bar.update(len(rows))
        tally.remaining = pending.count() - tally.failed
        return tally

    def _rotate_blobs(self, rotator: crypto.BlobRotator, primary: str, dry_run: bool, no_progress: bool) -> _Tally:
        """Files sealed as streams (attachment blobs): each is read and re-sealed whole, so the bar counts files."""
        with tqdm(total=rotator.count(), desc=rotator.label, unit="file", file=sys.stderr, disable=no_progress) as bar:
            result = rotator.rotate(primary, bar.update, dry_run)
        if dry_run:
            self.stdout.write(f"{rotator.label}: {result.rotated} file(s) to re-encrypt")
        return _Tally(
            rotator.label,
            rotated=result.rotated,
            already_primary=result.already_primary,
            failed=result.failed,
            failed_examples=result.failed_examples,
            remaining=result.skipped,
        )

    @staticmethod
    def _reencrypt(spec: crypto.EncryptedField, primary: str, row: models.Model, tally: _Tally) -> bool:
        blob = bytes(getattr(row, spec.field))
        row_id = crypto.row_id_of(row, spec)
        try:
            if crypto.key_id_of(blob) == primary:  # rotated by a concurrent run or rewritten by the service
                tally.already_primary += 1
                return False
            plaintext = crypto.decrypt(blob, purpose=spec.purpose, row_id=row_id)
        except crypto.DecryptionError:
            tally.failed += 1
            if len(tally.failed_examples) < 10:
                tally.failed_examples.append(str(row.pk))
            return False
        setattr(row, spec.field, crypto.encrypt(plaintext, purpose=spec.purpose, row_id=row_id))
        tally.rotated += 1
        return True
