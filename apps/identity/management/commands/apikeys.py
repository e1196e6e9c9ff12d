"""``manage.py apikeys create --client NAME | list | revoke PREFIX_OR_ID``: issue and manage API keys (D2)."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.identity import api_keys
from apps.identity.models import ApiKey


class Command(BaseCommand):
    help = "Create, list and revoke API keys. A new key is printed once; only its hash is stored."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="{create,list,revoke}")
        create = sub.add_parser("create", help="issue a new key and print it once")
        create.add_argument("--client", required=True, help="client name; becomes the caller's client_id")
        listing = sub.add_parser("list", help="list keys (prefix only)")
        listing.add_argument("--all", action="store_true", help="include revoked keys")
        revoke = sub.add_parser("revoke", help="revoke a key by its id or its prefix")
        revoke.add_argument("key", metavar="PREFIX_OR_ID")

    def handle(self, *args: Any, **options: Any) -> None:
        api_keys.seed_from_settings()
        action = options["action"]
        if action == "create":
            self._create(options["client"])
        elif action == "list":
            self._list(include_revoked=options["all"])
        else:
            self._revoke(options["key"])

    def _create(self, client: str) -> None:
        try:
            issued = api_keys.create_key(client)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        # The key alone on stdout, so `KEY=$(manage.py apikeys create --client x)` works; the notice goes to stderr.
        self.stdout.write(issued.key)
        self.stderr.write(
            f"Created API key id={issued.record.pk} prefix={issued.record.prefix} for client {issued.record.client!r}. "
            "It is shown only now."
        )

    def _list(self, *, include_revoked: bool) -> None:
        keys = ApiKey.objects.all() if include_revoked else ApiKey.objects.filter(revoked_at__isnull=True)
        self.stdout.write(f"{'ID':>6}  {'CLIENT':<24} {'PREFIX':<14} {'CREATED':<20} {'LAST USED':<20} REVOKED")
        for key in keys.order_by("client", "created_at"):
            self.stdout.write(
                f"{key.pk:>6}  {key.client:<24} {key.prefix:<14} {_when(key.created_at):<20} "
                f"{_when(key.last_used_at):<20} {_when(key.revoked_at)}"
            )

    def _revoke(self, reference: str) -> None:
        matches = list(ApiKey.objects.filter(prefix=reference, revoked_at__isnull=True))
        if not matches and reference.isdigit():
            matches = list(ApiKey.objects.filter(pk=int(reference)))
        if not matches:
            raise CommandError(f"No active API key with id or prefix {reference!r}.")
        if len(matches) > 1:
            ids = ", ".join(str(key.pk) for key in matches)
            raise CommandError(f"Prefix {reference!r} matches several keys (ids {ids}); revoke by id.")
        key = matches[0]
        if not api_keys.revoke(key):
            raise CommandError(f"API key id={key.pk} is already revoked.")
        self.stdout.write(f"Revoked API key id={key.pk} prefix={key.prefix} of client {key.client!r}.")


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else "-"
