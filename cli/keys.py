"""``switchyard keys``: make a tenant's API key, and the entry that configures it.

The key is printed once, on standard output, for the tenant to keep; only its SHA-256
goes into the configuration (the key file's entry, or ``SWITCHYARD_API_KEYS``), so
nothing stored by the operator or the services can be replayed as a key.
"""

from __future__ import annotations

import argparse
import json

from switchyard.config import Settings

from services.ingress.tenants import TenantLimits, hash_key, key_file_entry, new_key


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="keys_action", required=True, metavar="ACTION")
    new = actions.add_parser(
        "new",
        help="Make a new API key for a tenant and print the configuration entry for it.",
    )
    new.add_argument("tenant", help="tenant name: 1 to 32 lower-case letters, digits or '-'")
    new.add_argument("--requests-per-s", type=float, default=0.0, help="rate limit (0: none)")
    new.add_argument("--burst", type=int, default=0, help="bucket size (0: one second's worth)")
    new.add_argument(
        "--max-concurrent", type=int, default=0, help="calls in flight at most (0: no limit)"
    )


def run(settings: Settings, args: argparse.Namespace) -> int:
    key = new_key()
    limits = TenantLimits(args.requests_per_s, args.burst, args.max_concurrent)
    entry = key_file_entry(args.tenant, key, limits)
    print(f"API key for tenant {args.tenant} (shown once; give it to the tenant):")
    print(f"  {key}")
    print('Entry for SWITCHYARD_API_KEYS_FILE\'s "tenants" list:')
    print(f"  {json.dumps(entry)}")
    print("or, with the limits of SWITCHYARD_TENANT_*, in SWITCHYARD_API_KEYS:")
    print(f"  {args.tenant}={hash_key(key)}")
    return 0
