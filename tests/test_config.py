"""The configuration file: every problem is one line with its key and a fix, exit 2."""

from __future__ import annotations

import pathlib
import socket
import subprocess
import sys
import textwrap

import click
import pytest
from click.testing import CliRunner

from streamrep.catalogue import known_streams
from streamrep.cli import main
from streamrep.cli.options import config_from_click, config_option
from streamrep.config import Address, Config, load_config, parse_address
from streamrep.errors import ConfigError

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "examples" / "streamrep.yaml"


def write(tmp_path: pathlib.Path, text: str) -> str:
    path = tmp_path / "streamrep.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def check(path: str, *extra: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(main, ["check-config", path, *extra])
    return result.exit_code, result.output.splitlines()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_example_file_is_valid() -> None:
    config = load_config(EXAMPLE, streams=known_streams())
    assert config.server_name == "example.com"
    assert config.writers_of("to_device") == ("writer1", "writer2")
    assert config.writers_of("events") == ("writer1",)
    assert config.writers_of("typing") == ("main",)
    assert config.streams_written_by("writer2") == ("caches", "receipts", "to_device")
    assert config.metrics_address_of("writer1") == Address("127.0.0.1", 9101)
    assert config.metrics_address_of("main") == Address("127.0.0.1", 9100)


def test_missing_key(tmp_path: pathlib.Path) -> None:
    code, lines = check(write(tmp_path, "database: sqlite:///x.db\n"), "--no-port-check")
    assert code == 2
    assert len(lines) == 1
    assert lines[0].startswith("config error: server_name: missing; add `server_name:")


def test_unknown_stream(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, """\
        server_name: example.com
        stream_writers:
          evnets: [main]
        """)
    code, lines = check(path, "--no-port-check")
    assert code == 2
    assert lines == [
        'config error: stream_writers.evnets: unknown stream "evnets" (known: account_data, '
        'backfill, caches, events, receipts, to_device, typing); did you mean "events"?'
    ]


def test_multi_writer_stream_on_sqlite(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, """\
        server_name: example.com
        database: sqlite:///streamrep.db
        instance_map: {writer1: {}, writer2: {}}
        stream_writers:
          to_device: [writer1, writer2]
        """)
    code, lines = check(path, "--no-port-check")
    assert code == 2
    assert len(lines) == 1
    assert lines[0].startswith("config error: stream_writers.to_device: 2 writers (writer1, "
                               "writer2) on SQLite")
    assert "use a postgresql:// database or list one writer" in lines[0]
    # The same file on PostgreSQL is fine.
    config = load_config(path, {"database": "postgresql://u@127.0.0.1/db"},
                         streams=known_streams())
    assert config.writers_of("to_device") == ("writer1", "writer2")


def test_single_writer_stream_refuses_two_writers_anywhere(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, """\
        server_name: example.com
        database: postgresql://u@127.0.0.1/db
        instance_map: {a: {}, b: {}}
        stream_writers: {typing: [a, b], events: [a, b]}
        """)
    with pytest.raises(ConfigError) as info:
        load_config(path, streams=known_streams())
    assert info.value.problems == (
        "config error: stream_writers.typing: 2 writers, but typing has exactly one writer; "
        "list one instance",
        "config error: stream_writers.events: 2 writers, but events has exactly one writer; "
        "list one instance")
    multi_writer = [d.name for d in known_streams() if d.sequence_name is not None]
    assert "to_device" in multi_writer and "events" not in multi_writer


def test_port_in_use(tmp_path: pathlib.Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        path = write(tmp_path, f"server_name: example.com\nlisten: 127.0.0.1:{port}\n")
        code, lines = check(path)
        assert code == 2
        assert lines == [f"config error: listen: 127.0.0.1:{port} is already in use by another "
                         "process; stop the process using it or choose another port "
                         "(--listen HOST:PORT)"]
        # Skipping the check (a running deployment) passes.
        code, lines = check(path, "--no-port-check")
        assert code == 0, lines


def test_every_problem_is_reported_at_once(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, """\
        listen: 127.0.0.1:99999
        instance_map: {w1: {metrics_listen: nowhere}}
        stream_writers: {events: [w2]}
        keepalive: {ping_interval: -1}
        logging: {level: loud}
        colour: blue
        """)
    code, lines = check(path, "--no-port-check")
    assert code == 2
    keys = [line.split(":")[1].strip() for line in lines]
    assert keys == ["colour", "server_name", "listen", "instance_map.w1.metrics_listen",
                    "stream_writers.events[0]", "keepalive.ping_interval", "logging.level"]
    assert all(line.startswith("config error: ") and "; " in line for line in lines)


def test_yaml_errors_are_one_line(tmp_path: pathlib.Path) -> None:
    code, lines = check(write(tmp_path, "server_name: [\n"), "--no-port-check")
    assert code == 2 and len(lines) == 1
    assert "is not valid YAML at line 2" in lines[0]
    code, lines = check(write(tmp_path, "server_name: a\nserver_name: b\n"), "--no-port-check")
    assert code == 2 and len(lines) == 1
    assert "'server_name' appears twice" in lines[0]
    code, lines = check(str(tmp_path / "absent.yaml"))
    assert code == 2 and len(lines) == 1 and "does not exist" in lines[0]


def test_flags_override_the_file(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, """\
        server_name: example.com
        listen: 127.0.0.1:9092
        logging: {level: INFO}
        """)
    config = load_config(path, {"listen": "127.0.0.1:9999", "logging.level": "debug",
                                "server_name": None}, streams=known_streams())
    assert config.listen == Address("127.0.0.1", 9999)
    assert config.logging.level == "DEBUG"
    assert config.server_name == "example.com"  # None means "flag not given"


def test_bad_flag_names_the_flag(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, "server_name: example.com\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, {"database": "mysql://x"}, streams=known_streams())
    assert info.value.problems[0].startswith("config error: database (from --db): "
                                             "unsupported database scheme 'mysql'")


def _demo_command() -> click.Command:
    @click.command()
    @config_option
    @click.option("--listen", default="127.0.0.1:9092")
    @click.option("--server-name", default="localhost")
    @click.pass_context
    def serve(ctx: click.Context, config_path: str | None, listen: str,
              server_name: str) -> None:
        config = config_from_click(ctx, config_path,
                                   {"listen": "listen", "server_name": "server_name"})
        click.echo(f"{config.server_name} {config.listen}")
    return serve


def test_click_helper_flags_given_override_defaults_do_not(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, "server_name: example.com\nlisten: 127.0.0.1:7000\n")
    runner = CliRunner()
    result = runner.invoke(_demo_command(), ["--config", path])
    assert result.output == "example.com 127.0.0.1:7000\n"
    result = runner.invoke(_demo_command(), ["--config", path, "--listen", "127.0.0.1:7001"])
    assert result.output == "example.com 127.0.0.1:7001\n"
    result = runner.invoke(_demo_command(), [])
    assert result.output == "localhost 127.0.0.1:9092\n"
    result = runner.invoke(_demo_command(), ["--listen", "nowhere"])
    assert result.exit_code == 2
    assert result.output.startswith("config error: listen (from --listen): 'nowhere' is not")


def test_parse_address() -> None:
    assert parse_address("[::1]:9092") == Address("::1", 9092)
    assert str(Address("::1", 9092)) == "[::1]:9092"
    for bad in ("9092", "host:", "::1:9092", "h:0", "[::1]9092"):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_defaults_without_a_file() -> None:
    config = load_config(None, {"server_name": "example.com"}, streams=known_streams())
    assert isinstance(config, Config)
    assert config.is_sqlite and config.listen == Address("127.0.0.1", 9092)
    assert all(ws == ("main",) for ws in config.stream_writers.values())


def test_check_config_exit_code_from_a_real_process(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, "database: sqlite:///x.db\n")
    proc = subprocess.run([sys.executable, "-m", "streamrep", "check-config", path],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("config error: server_name")


def test_serve_refuses_a_port_in_use(tmp_path: pathlib.Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "streamrep", "serve", "--listen", f"127.0.0.1:{port}",
             "--db", f"sqlite:///{tmp_path}/s.db"],
            capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"config error: listen: 127.0.0.1:{port} is already in use by another process; "
        "stop the process using it or choose another port (--listen HOST:PORT)"]


def test_a_hub_reachable_from_other_machines_needs_tls_a_secret_or_insecure(
        tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, "server_name: example.com\nlisten: 0.0.0.0:9092\n")
    code, lines = check(path, "--no-port-check")
    assert code == 2
    assert lines == [
        "config error: listen: 0.0.0.0:9092 accepts connections from other machines, but "
        "neither tls nor shared_secret_file is set, so anyone who can reach it could read "
        "every stream and forge facts; set tls.cert and tls.key, or shared_secret_file, or "
        "`insecure: true` if a firewall already limits who can connect"]
    # Said outright, it is allowed, and check-config says what that means.
    path = write(tmp_path, "server_name: example.com\nlisten: 0.0.0.0:9092\ninsecure: true\n")
    code, lines = check(path, "--no-port-check")
    assert code == 0
    assert "  note: 0.0.0.0:9092 accepts replication connections from other machines; nothing " \
           "authenticates them (insecure: true), so firewall it" in lines
    # A secret protects it.
    secret = tmp_path / "replication.secret"
    secret.write_text("0123456789abcdef0123456789abcdef\n")
    secret.chmod(0o600)
    path = write(tmp_path, f"server_name: example.com\nlisten: 0.0.0.0:9092\n"
                           f"shared_secret_file: {secret}\n")
    code, lines = check(path, "--no-port-check")
    assert code == 0
    assert "  note: 0.0.0.0:9092 accepts replication connections from other machines; peers " \
           "must pass the shared secret" in lines
    # Loopback needs nothing, and check-config adds no note.
    code, lines = check(write(tmp_path, "server_name: example.com\n"), "--no-port-check")
    assert code == 0 and not any("note:" in line or "peers must" in line for line in lines)
    # serve's --listen is checked the same way.
    with pytest.raises(ConfigError) as info:
        load_config(None, {"server_name": "example.com", "listen": "0.0.0.0:9092"},
                    streams=known_streams())
    assert info.value.problems[0].startswith("config error: listen (from --listen): 0.0.0.0:9092 "
                                             "accepts connections from other machines")


def test_tls_section_and_instance_certificates(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, """\
        server_name: example.com
        listen: 10.0.0.5:9092
        tls:
          cert: /etc/streamrep/hub.crt
          key: /etc/streamrep/hub.key
          ca: /etc/streamrep/ca.crt
          require_client_cert: true
          server_hostname: hub.internal
        instance_map:
          writer1: {tls_cert: /etc/streamrep/writer1.crt, tls_key: /etc/streamrep/writer1.key}
        """)
    config = load_config(path, streams=known_streams())
    assert config.tls.enabled and config.tls.require_client_cert
    assert (config.tls.cert, config.tls.key, config.tls.ca, config.tls.server_hostname) == (
        "/etc/streamrep/hub.crt", "/etc/streamrep/hub.key", "/etc/streamrep/ca.crt", "hub.internal")
    assert config.instance_map["writer1"].tls_cert == "/etc/streamrep/writer1.crt"
    assert not config.insecure and config.shared_secret_file is None


def test_security_problems_are_one_line_each(tmp_path: pathlib.Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("short")
    secret.chmod(0o644)
    path = write(tmp_path, f"""\
        server_name: example.com
        tls: {{cert: hub.crt, require_client_cert: yes please, colour: blue}}
        shared_secret_file: {secret}
        insecure: maybe
        instance_map:
          writer1: {{tls_cert: w.crt}}
        """)
    with pytest.raises(ConfigError) as info:
        load_config(path, streams=known_streams())
    assert info.value.problems == (
        "config error: instance_map.writer1.tls_key: missing while the other is set; give "
        "tls_cert and tls_key together",
        "config error: tls.colour: unknown key (known: cert, key, ca, require_client_cert, "
        "server_hostname); remove it or fix the name",
        "config error: tls.require_client_cert: expected true or false, got 'yes please'; "
        "write true or false",
        "config error: tls.key: missing, so the hub has no certificate to present; set tls.cert "
        "and tls.key to the hub's PEM certificate chain and key, or remove the tls section",
        f"config error: shared_secret_file: {secret} has mode 0644, so other users may read the "
        f"secret; chmod 600 {secret}",
        "config error: insecure: expected true or false, got 'maybe'; write true or false",
    )
    secret.chmod(0o600)
    with pytest.raises(ConfigError) as info:
        load_config(None, {"server_name": "example.com", "shared_secret_file": str(secret)},
                    streams=known_streams())
    assert info.value.problems == (
        f"config error: shared_secret_file (from --shared-secret-file): {secret} holds 5 bytes, "
        "fewer than 16; write a long random secret: python -c 'import secrets; "
        "print(secrets.token_hex(32))' > FILE; chmod 600 FILE",)


def test_processes_connecting_to_the_hub_take_its_settings_from_the_file(tmp_path: pathlib.Path) -> None:
    from streamrep.cli._common import peer_settings

    path = write(tmp_path, """
        server_name: example.org
        database: sqlite:///hub.db
        listen: 127.0.0.1:19093
        keepalive: {ping_interval: 2, timeout: 7}
        backpressure: {max_queue: 500, max_line_length: 4096}
        """)
    settings = peer_settings(path, None, None, None)
    assert (settings.host, settings.port, settings.server_name) == ("127.0.0.1", 19093, "example.org")
    assert settings.database == "sqlite:///hub.db"
    conn = settings.connection
    assert (conn.ping_interval, conn.ping_timeout, conn.max_queued_commands, conn.max_line_length) == (
        2, 7, 500, 4096)
    # Flags win over the file.
    flagged = peer_settings(path, "127.0.0.1:19094", "sqlite:///other.db", "other.org")
    assert (flagged.port, flagged.database, flagged.server_name) == (19094, "sqlite:///other.db", "other.org")
