"""Library messages go through ``logging`` (issue 31): the service's failures reach an
application's logging, a study leaves Ax's process-wide log level as it found it, and the
command line prints the library's records as its own lines."""

from __future__ import annotations

import logging
import sqlite3

import pyro.distributions as dist
import pytest
import torch

from bayes_safe import TSASC, BayesianLinear
from bayes_safe._console import ConsoleHandler, console_logging
from bayes_safe.online import Decider


def _model():
    return BayesianLinear(dist.Normal(torch.zeros(3, dtype=torch.float64), 1.0).to_event(1), noise_std=0.5)


def test_a_failed_log_write_of_the_service_is_a_log_record(tmp_path, caplog, monkeypatch):
    from bayes_safe.online.serve import BadRequest, Service

    Decider(TSASC(_model(), [_model()], alpha=0.2), num_draws=20).save(tmp_path / "state")
    service = Service(tmp_path / "state")
    try:
        def full(*args, **kwargs):
            raise sqlite3.OperationalError("database or disk is full")

        monkeypatch.setattr(service.log, "write_decision", full)
        with caplog.at_level(logging.ERROR, logger="bayes_safe"), pytest.raises(BadRequest) as refused:
            service.decide(b'{"features": [[1, 0, 0], [0, 1, 0]], "baseline": 0}')
        assert refused.value.status == 503
        records = [r for r in caplog.records if r.name == "bayes_safe.serve"]
        assert records and records[0].levelno == logging.ERROR
        assert "the decision log could not be written: OperationalError: database or disk is full" in records[0].getMessage()
    finally:
        service.close()


def test_a_study_leaves_axs_log_level_as_it_found_it(tmp_path):
    from ax.utils.common.logger import ROOT_STREAM_HANDLER

    from bayes_safe.envs.video_upload import VideoUploadProblem
    from bayes_safe.tuning import ABTest, Study

    ROOT_STREAM_HANDLER.setLevel(logging.DEBUG)  # a user who wants Ax's every line
    try:
        problem = VideoUploadProblem(warmup=200, model={"nn_epochs": 1, "gp_epochs": 1})
        Study(ABTest(problem, n_users=200, batches=2), storage=tmp_path / "study.sqlite")
        assert ROOT_STREAM_HANDLER.level == logging.DEBUG
    finally:
        ROOT_STREAM_HANDLER.setLevel(logging.INFO)


def test_the_console_handler_prints_the_commands_lines(capsys):
    logger = logging.getLogger("bayes_safe")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    try:
        console_logging("serve")
        console_logging("serve")  # once per main: not twice
        assert sum(isinstance(h, ConsoleHandler) for h in logger.handlers) == 1
        logging.getLogger("bayes_safe.serve").info("wrote %s", "state/")
        logging.getLogger("bayes_safe.serve").error("snapshot failed: %s", "OSError")
        out, err = capsys.readouterr()
        assert out == "bayes-safe serve: wrote state/\n" and err == "bayes-safe serve: snapshot failed: OSError\n"
        # an application that configured logging keeps it: serve() adds nothing then
        for h in [h for h in logger.handlers if isinstance(h, ConsoleHandler)]:
            logger.removeHandler(h)
        own = logging.NullHandler()
        logger.addHandler(own)
        console_logging("serve", only_if_unconfigured=True)
        assert not any(isinstance(h, ConsoleHandler) for h in logger.handlers)
    finally:
        logger.handlers[:] = saved[0]
        logger.setLevel(saved[1])
        logger.propagate = saved[2]
