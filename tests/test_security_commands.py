"""TLS and the shared secret from the command line: the demo passes over mutual TLS
with the secret, ``serve`` refuses an exposed port, and ``write``/``tail`` reach a
protected hub only with the right credentials."""

from __future__ import annotations

import os
import pathlib
import secrets
import signal
import subprocess
import sys
import textwrap
from typing import Iterator

import pytest
import yaml

pytest.importorskip("cryptography")

from streamrep.demo.certificates import DeploymentCertificates, make_deployment_certificates  # noqa: E402
from streamrep.demo.processes import free_port, wait_for_port  # noqa: E402


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("STREAMREP_CONFIG", None)
    return env


def streamrep(*args: str, cwd: pathlib.Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamrep", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_demo_passes_over_mutual_tls_with_the_shared_secret(tmp_path: pathlib.Path) -> None:
    proc = streamrep("demo", "--duration", "3", "--rate", "120", "--rooms", "4", "--workers", "2",
                     "--catch-up-timeout", "60", "--mutual-tls", "--shared-secret",
                     "--workdir", str(tmp_path / "demo"), cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exactly-once check passed: 2 workers" in proc.stdout
    assert "facts: 0 lost, 0 duplicated" in proc.stdout
    config = yaml.safe_load((tmp_path / "demo" / "streamrep.yaml").read_text())
    assert config["tls"]["require_client_cert"] is True
    assert config["instance_map"]["worker1"]["tls_cert"].endswith("client-worker1.crt")
    secret_file = pathlib.Path(config["shared_secret_file"])
    assert secret_file.stat().st_mode & 0o077 == 0
    # Every process got in at the first try: no authentication failed.
    assert "auth_failed" not in (tmp_path / "demo" / "hub.log").read_text()


def test_serve_refuses_an_exposed_port_without_protection(tmp_path: pathlib.Path) -> None:
    proc = streamrep("serve", "--listen", f"0.0.0.0:{free_port()}", "--db",
                     f"sqlite:///{tmp_path}/s.db", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"config error: listen (from --listen): 0.0.0.0:{proc.args[5].rpartition(':')[2]} accepts "
        "connections from other machines, but neither tls nor shared_secret_file is set, so "
        "anyone who can reach it could read every stream and forge facts; set tls.cert and "
        "tls.key, or shared_secret_file, or `insecure: true` if a firewall already limits who "
        "can connect"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DeploymentCertificates:
    return make_deployment_certificates(str(tmp_path_factory.mktemp("pki")), ["writer1", "tail"])


@pytest.fixture
def protected_hub(tmp_path: pathlib.Path, certs: DeploymentCertificates) -> Iterator[pathlib.Path]:
    """A ``streamrep serve`` with mutual TLS and the shared secret; yields its file."""
    secret = tmp_path / "replication.secret"
    secret.write_text(secrets.token_hex(32) + "\n")
    secret.chmod(0o600)
    port = free_port()
    path = tmp_path / "streamrep.yaml"
    path.write_text(textwrap.dedent(f"""\
        server_name: cli.example
        database: sqlite:///{tmp_path}/cli.db
        listen: 127.0.0.1:{port}
        instance_map:
          main: {{}}
          writer1: {{tls_cert: {certs.clients['writer1'].cert}, tls_key: {certs.clients['writer1'].key}}}
          tail: {{tls_cert: {certs.clients['tail'].cert}, tls_key: {certs.clients['tail'].key}}}
        stream_writers:
          caches: [writer1]
        tls: {{cert: {certs.hub.cert}, key: {certs.hub.key}, ca: {certs.ca}, require_client_cert: true}}
        shared_secret_file: {secret}
        """))
    log = open(tmp_path / "hub.log", "wb")
    hub = subprocess.Popen([sys.executable, "-m", "streamrep", "serve", "--config", str(path)],
                           cwd=tmp_path, env=_env(), stdout=log, stderr=log)
    try:
        assert wait_for_port("127.0.0.1", port, 30)
        yield path
    finally:
        hub.send_signal(signal.SIGTERM)
        assert hub.wait(20) == 0
        log.close()


@pytest.mark.slow
def test_write_and_tail_reach_a_protected_hub_only_with_credentials(
        protected_hub: pathlib.Path, tmp_path: pathlib.Path, certs: DeploymentCertificates) -> None:
    config = str(protected_hub)
    written = streamrep("write", "--config", config, "--instance-name", "writer1", "--stream",
                        "caches", "--count", "20", "--announce-timeout", "20", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert "20 facts persisted" in written.stderr and "announced" in written.stderr
    tailed = streamrep("tail", "--config", config, "--name", "tail", "--stream", "caches",
                       "--from", "0", "--limit", "20", cwd=tmp_path)
    assert tailed.returncode == 0, tailed.stderr
    assert len(tailed.stdout.splitlines()) == 20

    wrong_secret = tmp_path / "wrong.secret"
    wrong_secret.write_text(secrets.token_hex(32))
    wrong_secret.chmod(0o600)
    refusals = {
        "wrong secret": ["--shared-secret-file", str(wrong_secret)],
        "another instance's certificate": ["--tls-cert", certs.clients["writer1"].cert,
                                           "--tls-key", certs.clients["writer1"].key],
    }
    for why, flags in refusals.items():
        refused = streamrep("tail", "--config", config, "--name", "tail", "--stream", "caches",
                            "--from", "0", "--limit", "1", "--give-up-after", "2", *flags,
                            cwd=tmp_path)
        assert refused.returncode != 0, why
        assert refused.stdout == "", why
    plain = streamrep("tail", "--connect", config_listen(protected_hub), "--name", "tail",
                      "--stream", "caches", "--from", "0", "--limit", "1", "--give-up-after", "2",
                      cwd=tmp_path)
    assert plain.returncode != 0 and plain.stdout == ""
    log = (tmp_path / "hub.log").read_text()
    assert "wrong shared secret" in log
    assert "NAME tail is not a name of the client certificate (writer1)" in log


def config_listen(path: pathlib.Path) -> str:
    return str(yaml.safe_load(path.read_text())["listen"])


def test_check_config_loads_the_certificates_and_the_secret(
        tmp_path: pathlib.Path, certs: DeploymentCertificates) -> None:
    from click.testing import CliRunner

    from streamrep.cli import main

    def check(tls: str, *extra: str) -> tuple[int, str]:
        path = tmp_path / "c.yaml"
        path.write_text(f"server_name: example.com\ninstance_map: {{main: {{}}, writer1: "
                        f"{{tls_cert: {certs.clients['writer1'].cert}, tls_key: /nowhere.key}}}}\n"
                        f"tls: {tls}\n")
        result = CliRunner().invoke(main, ["check-config", str(path), "--no-port-check", *extra])
        return result.exit_code, result.output

    good = f"{{cert: {certs.hub.cert}, key: {certs.hub.key}, ca: {certs.ca}}}"
    code, out = check(good)
    assert code == 0 and "peers must pass TLS" in out
    code, out = check(f"{{cert: {certs.hub.cert}, key: {certs.clients['writer1'].key}}}")
    assert code == 2
    assert out.splitlines() == [f"config error: tls.key: {certs.clients['writer1'].key} is not the "
                                f"private key of {certs.hub.cert}; give the key the certificate "
                                "was issued for"]
    code, out = check(good, "--instance", "writer1")
    assert code == 2
    assert out.splitlines() == ["config error: instance_map.writer1.tls_key: /nowhere.key does not "
                                "exist; give the path of a PEM file"]
