"""The test harness's own environment rules (``tests/conftest.py``)."""
import conftest


def test_xdist_workers_sharing_a_gpu_do_not_preallocate():
    worker = {"PYTEST_XDIST_WORKER": "gw1"}
    assert conftest.shared_gpu_env(worker, gpu_plugin=True) == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def test_no_change_outside_xdist_without_a_gpu_or_when_the_user_chose():
    assert conftest.shared_gpu_env({}, gpu_plugin=True) == {}                 # one process
    assert conftest.shared_gpu_env({"PYTEST_XDIST_WORKER": "gw0"}, gpu_plugin=False) == {}
    chose = {"PYTEST_XDIST_WORKER": "gw0", "XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    assert conftest.shared_gpu_env(chose, gpu_plugin=True) == {}
