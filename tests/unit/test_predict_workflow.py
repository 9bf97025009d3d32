"""workflows/prediction.py called from Python: a prediction, a machine comparison and a store's accuracy
come back as data, nothing is printed, and bad input is one RequestError before anything is predicted."""

from __future__ import annotations

import pytest

from dlbench.workflows import (MachineComparison, PredictionAccuracy, PredictRequest, RequestError,
                               SinglePrediction, predict)


@pytest.fixture(autouse=True)
def empty_store(tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_STORE", str(tmp_path / "empty-store"))


def test_one_prediction_on_a_datasheet_machine_is_returned_not_printed(capsys):
    result = predict(PredictRequest(network="resnet50", framework="torch", batch=64, machine=["h200"]))
    assert isinstance(result, SinglePrediction)
    assert result.network == "resnet50" and result.profile.source == "datasheet" and result.workers == 1
    assert result.prediction.iteration_s > 0 and result.prediction.forward_s > 0
    slower = predict(PredictRequest(network="resnet50", framework="torch", batch=64, machine=["h200"],
                                    efficiency=["convolution=0.05"]))
    assert slower.prediction.iteration_s > result.prediction.iteration_s
    assert capsys.readouterr() == ("", "")


def test_a_suite_compares_the_machines_ranked(capsys):
    result = predict(PredictRequest(suite=["fcn"], framework="torch", machine=["a100", "h200"]))
    assert isinstance(result, MachineComparison)
    assert result.frameworks == ["torch"] and result.device == "cuda"
    first = [r for r in result.rows if (r.benchmark, r.batch) == (result.rows[0].benchmark, result.rows[0].batch)]
    assert [(r.machine, r.rank) for r in first] == [("datasheet:h200", 1), ("datasheet:a100", 2)]  # h200 the faster
    assert capsys.readouterr() == ("", "")


def test_accuracy_of_a_store_without_runs_is_empty_data(tmp_path, capsys):
    (tmp_path / "store").mkdir()
    result = predict(PredictRequest(accuracy=True, store=tmp_path / "store"))
    assert isinstance(result, PredictionAccuracy)
    assert result.runs == [] and result.data_term == [] and not result.matching
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize(("request_", "says"), [
    (PredictRequest(network="resnet50", framework="torch"), "predict needs --batch"),
    (PredictRequest(network="resnet50", framework="torch", batch=8, mode="generate"), "unknown mode 'generate'"),
    (PredictRequest(network="resnet50", framework="torch", batch=8, precision="fp7"), "unknown precision 'fp7'"),
    (PredictRequest(network="nonet", framework="torch", batch=8, machine=["h200"]), "unknown network 'nonet'"),
    (PredictRequest(network="resnet50", framework="torch", batch=8, machine=["datasheet:h900"]), "h900"),
    (PredictRequest(network="resnet50", framework="torch", batch=8, workers=[2], mode="infer"), "needs --mode train"),
    (PredictRequest(io_bandwidth=0.0, network="resnet50"), "--io-bandwidth must be"),
    (PredictRequest(accuracy=True, batch=8), "--batch is for one prediction"),
    (PredictRequest(recompute=True), "go with --accuracy"),
    (PredictRequest(suite=["fcn"], framework="caffe", machine=["h200"]), "caffe"),
    (PredictRequest(suite=["fcn"], threads=4, machine=["h200"]), "--threads is for one prediction"),
])
def test_bad_input_is_one_request_error_and_nothing_printed(request_, says, capsys):
    with pytest.raises(RequestError) as raised:
        predict(request_)
    assert says in str(raised.value)
    assert capsys.readouterr() == ("", "")


def test_accuracy_needs_an_existing_store(tmp_path):
    with pytest.raises(RequestError, match="no store at"):
        predict(PredictRequest(accuracy=True, store=tmp_path / "missing"))


def test_the_command_lists_the_run_precisions_and_refuses_another(monkeypatch):
    from typer.testing import CliRunner

    from dlbench.cli import app

    monkeypatch.setenv("COLUMNS", "200")
    shown = CliRunner().invoke(app, ["predict", "--help"])
    assert shown.exit_code == 0 and "fp32|tf32|amp_bf16|amp_fp16" in shown.output
    assert "float64" not in shown.output  # the check's precision, never a prediction's
    refused = CliRunner().invoke(app, ["predict", "--network", "resnet50", "--framework", "torch", "--batch", "8",
                                       "--machine", "h200", "--precision", "float64"])
    assert refused.exit_code == 2
    chosen = CliRunner().invoke(app, ["predict", "--network", "resnet50", "--framework", "torch", "--batch", "8",
                                      "--machine", "h200", "--precision", "amp_bf16", "--format", "json"])
    assert chosen.exit_code == 0 and '"precision": "amp_bf16"' in chosen.output
