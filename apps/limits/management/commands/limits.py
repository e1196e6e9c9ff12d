"""``manage.py limits``: a user's rates and quotas (D11).

    limits show bob                               every limit (override or default) and the kept totals
    limits set bob --memories 200000 --uploads-burst 50 --note "bulk import"
    limits set bob --memories default             back to the default
    limits reset bob                              drop every override of bob
    limits list                                   users with overrides
    limits recount [bob ...] [--all]              rebuild the kept totals from the data

Byte quotas take a unit (``--memory-bytes 2GiB``). Overrides apply within LIMITS_CACHE_SECONDS in running
processes.
"""

from __future__ import annotations

import re
from argparse import ArgumentParser, ArgumentTypeError
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.limits import services
from apps.limits.definitions import QUOTAS
from apps.limits.models import UserLimits

_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "kb": 1000, "mb": 1000**2,
          "gb": 1000**3, "tb": 1000**4}
DEFAULT = object()


def amount(text: str) -> Any:
    """An integer, optionally with a byte unit (KiB, MiB, GiB, ...), or ``default``."""
    if text.strip().lower() == "default":
        return DEFAULT
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ArgumentTypeError(f"not an amount: {text!r} (an integer, optionally with KiB/MiB/GiB, or 'default')")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


class Command(BaseCommand):
    help = "Show and change a user's request rates and stored-total quotas; rebuild the kept totals."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, metavar="{show,set,reset,list,recount}")
        show = sub.add_parser("show", help="every limit of a user and what they store")
        show.add_argument("user")
        change = sub.add_parser("set", help="override limits of a user ('default' puts one back)")
        change.add_argument("user")
        for field in services.OVERRIDE_FIELDS:
            change.add_argument(f"--{field.replace('_', '-')}", dest=field, type=amount, metavar="N")
        change.add_argument("--note", help="why (shown in the admin)")
        reset = sub.add_parser("reset", help="drop every override of a user")
        reset.add_argument("user")
        sub.add_parser("list", help="users with overrides")
        recount = sub.add_parser("recount", help="rebuild kept totals from the stored data")
        recount.add_argument("users", nargs="*")
        recount.add_argument("--all", action="store_true", help="every user with data or a kept total")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "show":
            self._show(options["user"])
        elif action == "set":
            changes = {
                field: (None if options[field] is DEFAULT else options[field])
                for field in services.OVERRIDE_FIELDS
                if options.get(field) is not None
            }
            if not changes and options["note"] is None:
                raise CommandError("nothing to set: name at least one limit (see --help)")
            try:
                services.set_limits(options["user"], changes, note=options["note"])
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            self._show(options["user"])
        elif action == "reset":
            deleted, _ = UserLimits.objects.filter(user_id=options["user"]).delete()
            self.stdout.write(f"{options['user']}: {'overrides dropped' if deleted else 'had no overrides'}.")
        elif action == "list":
            for row in UserLimits.objects.order_by("user_id"):
                set_fields = [
                    f"{field}={getattr(row, field)}" for field in services.OVERRIDE_FIELDS if getattr(row, field) is not None
                ]
                self.stdout.write(f"{row.user_id}: {', '.join(set_fields) or '-'}{f'  ({row.note})' if row.note else ''}")
        else:
            users = services.known_users() if options["all"] else options["users"]
            if not users:
                raise CommandError("name users to recount, or --all")
            for user in users:
                changed = {
                    name: f"{before} -> {after}" for name, (before, after) in services.recount(user).items()
                    if before != after
                }
                self.stdout.write(f"{user}: {changed or 'unchanged'}")

    def _show(self, user: str) -> None:
        used = services.usage(user)
        self.stdout.write(f"{'LIMIT':<26} {'VALUE':>14} {'DEFAULT':>14} {'USED':>14}")
        for field, limit in services.limits_of(user).items():
            marker = " *" if limit["overridden"] else ""
            in_use = str(used[field]) if field in used else ("-" if field in QUOTAS else "")
            self.stdout.write(f"{field:<26} {limit['value']:>14} {limit['default']:>14} {in_use:>14}{marker}")
        self.stdout.write("(* overridden; members_per_conversation is counted per conversation)")
