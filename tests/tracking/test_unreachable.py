"""What counts as the tracking server being down (spooled) rather than a bad request (raised):
a server killed while it answered cuts its response, which urllib3 reports as a broken
connection inside MLflow's exception (seen in CI: a run failed instead of spooling)."""
from mlflow.exceptions import MlflowException

from tracking.spool import unreachable


def test_a_cut_response_and_a_refused_connection_are_an_outage():
    cut = MlflowException("API request to http://127.0.0.1:1/api/2.0/mlflow/runs/log-batch failed with exception "
                          "('Connection broken: IncompleteRead(10 bytes read, 2 more expected)', "
                          "IncompleteRead(10 bytes read, 2 more expected))")
    refused = MlflowException("API request to http://127.0.0.1:1/api/2.0/mlflow/runs/get failed with exception "
                              "HTTPConnectionPool(host='127.0.0.1', port=1): Max retries exceeded")
    assert unreachable(cut) and unreachable(refused) and unreachable(ConnectionResetError())


def test_a_bad_request_is_not():
    assert not unreachable(MlflowException("INVALID_PARAMETER_VALUE: Param value 'x' had length 7000"))
