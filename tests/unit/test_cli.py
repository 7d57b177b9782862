"""The `switchyard` command as an operator meets it."""

from __future__ import annotations

import os
import subprocess
import sys


def _switchyard(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_config_prints_the_effective_configuration_with_the_password_hidden() -> None:
    done = _switchyard("config", SWITCHYARD_REDIS_URL="redis://app:s3cret@cache:6379/2")
    assert done.returncode == 0
    assert '"redis_url": "redis://app:***@cache:6379/2"' in done.stdout
    assert "s3cret" not in done.stdout


def test_bad_configuration_is_one_clear_message_and_exit_2() -> None:
    done = _switchyard("config", SWITCHYARD_TOPIC_PARTITIONS="zero")
    assert done.returncode == 2
    assert "SWITCHYARD_TOPIC_PARTITIONS='zero'" in done.stderr
    assert "Traceback" not in done.stderr


def test_check_on_the_embedded_default_reports_both_parts_ok() -> None:
    done = _switchyard("check")
    assert done.returncode == 0
    assert "bus (memory)" in done.stdout
    assert "state (memory)" in done.stdout


def test_check_names_an_unreachable_broker_and_exits_1() -> None:
    done = _switchyard("check", SWITCHYARD_BUS="kafka", SWITCHYARD_KAFKA_BOOTSTRAP="127.0.0.1:1")
    assert done.returncode == 1
    assert "127.0.0.1:1" in done.stderr
    assert "Traceback" not in done.stderr


def test_demo_answers_every_request_exactly_once_despite_the_crash() -> None:
    done = _switchyard("demo-bus", "--requests", "300")
    assert done.returncode == 0, done.stderr
    assert "completions (one per request)   300   missing 0, doubled 0" in done.stdout
    assert "requests traced end to end      300" in done.stdout
    assert "bad_bytes" in done.stdout


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_research_command_without_the_research_tools_says_so_and_exits_2() -> None:
    """What the service image (no research/) answers to ``switchyard simulate``."""
    done = _run_python(
        "import sys; sys.modules['research'] = None\n"
        "from cli.main import main\n"
        "main(['simulate', '--workers', '4'])\n"
    )
    assert done.returncode == 2
    assert "switchyard simulate: the research tools are not installed here" in done.stderr
    assert "Traceback" not in done.stderr


def test_help_lists_the_research_commands_without_importing_them() -> None:
    done = _run_python(
        "import sys\n"
        "from cli.main import build_parser\n"
        "help_text = build_parser(['service', 'ingress']).format_help()\n"
        "print(help_text)\n"
        "print('loaded:', sorted(m for m in sys.modules if m.startswith('research')))\n"
    )
    assert done.returncode == 0, done.stderr
    for command in ("simulate", "window", "estimates", "multimodel", "service", "demo"):
        assert f"    {command}" in done.stdout
    assert "loaded: []" in done.stdout
