"""Evaluations on a Dask cluster: ``DaskEvalPool`` (``pool.py``) sends each evaluation to a worker
of a Dask scheduler (one worker per GPU), which runs it with the same evaluator as the local pool
(``worker.py``); ``events.py`` holds what the pool reports (workers, evaluations in flight).

    forge search WS --cluster tcp://HOST:8786        # or [pool] scheduler = "tcp://HOST:8786"
"""
