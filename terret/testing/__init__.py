"""Test suites that ship with Terret, for adapters written outside it.

``terret.testing.store_contract.StoreContract`` is the store port's contract (pytest): subclass
it in your adapter's tests, as Terret's own ``tests/contract`` does for memory, SQLite and
EventStoreDB. The port is also the ``eventsourcing`` library's ``ApplicationRecorder``, so the
library's ``eventsourcing.tests.persistence.ApplicationRecorderTestCase`` applies too (see
``tests/contract/test_library_cases.py``). Importing this package needs pytest.
"""
