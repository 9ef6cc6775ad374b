"""The driver-to-worker handoff of one run (``run.pack_item``) survives its plain-dict form."""

import pickle

import pydantic
import pytest

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.pack_item import PackItem
from tests.helpers import tiny_spec


@pytest.fixture(scope="module")
def item() -> PackItem:
    (run,) = plan(parse_spec(tiny_spec("item")))
    return PackItem(run, "/data/prepared", "sha256:abc", "0123abcd")


def test_round_trip_through_the_pickled_config(item):
    d = pickle.loads(pickle.dumps({"runs": [item.to_dict()]}))["runs"][0]
    assert PackItem.from_dict(d) == item
    assert set(d) == {"run", "data_path", "data_hash", "mlflow_run_id"} and d["run"]["run_id"] == item.run.run_id
    assert pickle.dumps(d["run"]).find(b"RunSpec") == -1  # plain JSON values: no product class pickled


def test_a_missing_data_hash_is_none_and_a_bad_run_is_refused(item):
    d = item.to_dict()
    del d["data_hash"]
    assert PackItem.from_dict(d).data_hash is None
    with pytest.raises(pydantic.ValidationError):
        PackItem.from_dict({**d, "run": {**d["run"], "steps": "many"}})
    with pytest.raises(KeyError):
        PackItem.from_dict({k: v for k, v in d.items() if k != "mlflow_run_id"})
