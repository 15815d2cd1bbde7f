"""The weight store's scale bench (c2/bench/weight_sync.py --scale) on a real S3-protocol server:
requests per idle poll counted at the server do not grow with the history, and every follower
of a small fleet receives every version."""

import pytest

from c2.bench import weight_sync as bench


@pytest.fixture
def s3(monkeypatch, tmp_path):
    pytest.importorskip("moto.server")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(name, "bench" if name != "AWS_REGION" else "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws_config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws_credentials"))
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    server, url = bench.start_s3()
    counter = bench.HttpCount(server._server.app)
    server._server.app = counter
    yield url, counter
    server.stop()


def test_poll_cost_is_one_request_whatever_the_history(s3):
    url, counter = s3
    rows = bench.poll_cost(f"{url}/history", counter, histories=(3, 20), polls=5)
    assert [r["versions"] for r in rows] == [3, 20]
    assert [r["http_requests_per_poll"] for r in rows] == [1.0, 1.0]  # one GET of LATEST


def test_every_follower_receives_every_version(s3):
    url, counter = s3
    row = bench.fleet_latency(f"{url}/fleet", counter, subscribers=3, versions=2)
    assert row["deliveries"] == 3 * 2 and row["fetch_errors"] == 0
    assert row["http_requests_per_poll"] == pytest.approx(1.0, abs=0.05)  # renewals are rare
