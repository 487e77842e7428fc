"""The agent core: the Search-R1 protocol, the one agent loop, its events and backends.

Front ends (`app/`, `evaluator/`) build on this; it depends only on `retriever`'s `Doc`.
"""
