"""The pieces every benchmark shares (bench/README.md): common.py (zoo
access, onnxruntime sessions, timing), cold_sample.py (one cold sample in a
fresh process) and peer_engines.py (the peer engines' conversion, load and
run, and the child process that samples them). Benchmarks import them as
`harness.common` / `harness.peer_engines` with bench/ on sys.path (a script
in bench/ has it as its own folder); the two child scripts are spawned by
path, bench/harness/cold_sample.py and bench/harness/peer_engines.py."""
