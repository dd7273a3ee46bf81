"""`hearthgate bench batch`: the Batch API with real vLLM and real Redis.

Four measurements, interleaved round by round (round i runs A, C, D, B in that order, so
box drift affects all of them alike):

- **A**: interactive attainment (the scenario's interactive flows: home-mix without its
  rag, embed and batch flows) through a fresh gateway, no batch running;
- **C**: the batch's lines per second through a fresh gateway, no interactive load;
- **D**: the same lines sent straight to vLLM by a client at full concurrency (generation
  lines to the gen worker, embeddings lines to the embeddings worker, each with at most
  ``--concurrency`` in flight, both at once), no interactive load;
- **B**: A again with the batch running (created ``--batch-lead`` seconds before the
  interactive warm-up requests), and **E**: the batch's lines per second while the
  interactive arrivals are on, from B's polls.

The batch is ``--lines`` lines: ``--summary-fraction`` of them long-prompt summaries (the
prompt lengths of the scenario's RAG flow, ``--summary-tokens`` out, ``temperature 0``,
``ignore_eos``), the rest short embeddings inputs (the lengths of its embeddings flow). One
batch per endpoint, both created at once by one app (``nightly``). A batch run's lines/s =
lines / (time from the first ``POST /v1/batches`` until the last batch was seen completed,
polling ``GET /v1/batches/{id}`` every ``--poll-interval`` s); for D, lines / (first request
to last response). Every measurement gets its own prompt words (same lengths), so vLLM's
prefix cache never serves one measurement from another's prompts.

Workers (the layout of ``loadtests/targets/local.yaml``: gen worker core 1, embeddings
worker core 0, gateway and this load generator core 0) and Redis (``.run/bench/redis``,
core 0) start once; each measurement gets a fresh gateway and an emptied Redis (so no
fair-share snapshot carries over). Everything started is stopped on every exit path.

The parts, lowest first (each module imports only those above it):

- ``lines.py``: the batch's lines (its shape, the planned requests, the JSONL input files);
- ``rates.py``: lines per second, the rate within a window, the aggregation over rounds;
- ``report.py``: the markdown report of a summary;
- ``client.py``: talking to the gateway (the Files and Batches endpoints, submit and poll);
- ``measure.py``: one measurement (C or the warm-up batch, D, A or B);
- ``rig.py``: the processes (workers, Redis, a fresh gateway per measurement) and the rounds;
- ``summary.py``: the JSON summary of a run;
- ``cli.py``: the command line (``add_args``, ``run``).

The first three are pure.
"""
