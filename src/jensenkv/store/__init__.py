"""Where runs leave their results, split by job: ``record`` (the run record as a type, its errors and digest),
``files`` (atomic writes, JSON, file hashes), ``lock`` (leased lock files), ``record_check`` (what a record must
hold to be trusted), ``results`` (the results store: paths, run folders, save and load of records) and ``llm``
(the LLM partial-prefill store). Nothing here imports pandas at module level: tables are built in
``jensenkv.report.store_frame``."""
