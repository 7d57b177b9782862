"""The container tier: docker-compose.yml in real containers (``make compose-test``).

It needs a Docker engine and compose v2 (``deploy/local/docker.sh`` provides both) and
builds images of several GB, so a plain ``pytest`` leaves it out: its tests are
collected only when ``SWITCHYARD_CONTAINER_TESTS=1`` (``make test`` and ``make
compose-test`` set it, after running ``docker.sh``). Once selected, nothing skips: a
missing engine, image or answer is a failure.

This file imports nothing heavy: pytest reads it on every run, selected or not.
"""

from __future__ import annotations

import os

SELECTED = os.environ.get("SWITCHYARD_CONTAINER_TESTS") == "1"
collect_ignore_glob = [] if SELECTED else ["*"]
