"""The operator files in contrib/ work as they are: the Prometheus rules pass promtool
(syntax and their own unit tests) and are the alerts docs/operations.md documents,
every query of the rules and the Grafana dashboard names a metric the code exports,
and the systemd units run commands and options that exist."""

from __future__ import annotations

import configparser
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import click
import pytest
import yaml

from streamrep.cli import main
from streamrep.cli.exits import ExitCode
from support.required import missing

ROOT = Path(__file__).resolve().parent.parent
CONTRIB = ROOT / "contrib"
RULES = CONTRIB / "prometheus" / "streamrep-alerts.yml"
DASHBOARD = CONTRIB / "grafana" / "streamrep-dashboard.json"
UNITS = sorted((CONTRIB / "systemd").glob("*.service"))
_METRIC = re.compile(r"\bstreamrep_\w+")


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        missing("STREAMREP_REQUIRE_PROMTOOL", "promtool is not installed (Debian: apt-get install prometheus)")
    return found


def _rules() -> list[dict[str, object]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _exported_metrics() -> set[str]:
    """Every metric a hub and a process's link (over TCP or Redis) expose, counters
    with their ``_total``."""
    from streamrep.replication import LinkSettings, MemorySource, ReplicationHub, open_link

    hub = ReplicationHub("hub.example", MemorySource(["caches"]), port=0)
    tcp = open_link(LinkSettings("worker1", "hub.example", hub=("127.0.0.1", 1)))
    redis = open_link(LinkSettings("worker1", "hub.example", redis_url="redis://127.0.0.1:1"))
    return {family.name + ("_total" if family.type == "counter" else "")
            for registry in (hub.metrics.registry, tcp.metrics.registry, redis.metrics.registry)
            for family in registry.collect()}


def test_rules_pass_promtool() -> None:
    promtool = _promtool()
    for args in (["check", "rules", RULES.name], ["test", "rules", "streamrep-alerts.test.yml"],
                 ["check", "config", "prometheus.yml"]):
        checked = subprocess.run([promtool, *args], cwd=RULES.parent, capture_output=True,
                                 text=True, timeout=120)
        assert checked.returncode == 0, (args, checked.stdout, checked.stderr)


def test_rules_are_the_documented_alerts() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("Alert on:"):]
    section = section[:section.index("\n## ")]
    documented = [re.sub(r"`", "", title)
                  for title in re.findall(r"^\* \*\*(.+?)\*\*", section, re.M)]
    assert documented
    assert sorted(str(rule["annotations"]["summary"]) for rule in _rules()) == sorted(documented)  # type: ignore[index]


def test_every_query_names_an_exported_metric() -> None:
    exported = _exported_metrics()
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(queries) == len(dashboard["panels"])
    queries += [str(rule["expr"]) for rule in _rules()]
    queries += [dashboard["templating"]["list"][0]["definition"]]
    unknown = sorted({name for query in queries for name in _METRIC.findall(query)} - exported)
    assert not unknown, f"queries name metrics nothing exports: {unknown} (exported: {sorted(exported)})"
    assert all(_METRIC.search(query) for query in queries)


def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(path)
    return parser


def _command_line(unit: configparser.ConfigParser) -> list[str]:
    """ExecStart's arguments after the program, with %i and ${VAR} filled in."""
    service = unit["Service"]
    env = dict(pair.split("=", 1) for pair in shlex.split(service.get("Environment", "")))
    line = re.sub(r"\$\{(\w+)\}", lambda m: env[m[1]], service["ExecStart"].replace("%i", "writer1"))
    program, *args = shlex.split(line)
    assert program.endswith("/streamrep"), program
    return args


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_systemd_unit_runs_a_real_command(path: Path) -> None:
    unit = _unit(path)
    args = _command_line(unit)
    parent = click.Context(main, info_name="streamrep")
    command = main.get_command(parent, args[0])
    assert command is not None, args[0]
    with command.make_context(args[0], args[1:], parent=parent, resilient_parsing=False) as ctx:
        assert ctx.params.get("config_path") == "/etc/streamrep/streamrep.yaml"
    statuses = unit["Service"].get("RestartPreventExitStatus", "").split()
    assert all(int(status) in ExitCode.__members__.values() for status in statuses), statuses
    assert f"contrib/systemd/{path.name}" in (ROOT / "docs" / "operations.md").read_text()


def test_units_cover_serve_write_and_a_follower() -> None:
    assert sorted(_command_line(_unit(path))[0] for path in UNITS) == ["serve", "tail", "write"]
