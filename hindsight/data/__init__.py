"""Data.

Rows from JSONL, parquet or the hub with line-numbered errors, chat-format rows, the demo and
bench tasks, and the DVC md5.
"""
