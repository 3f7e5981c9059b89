"""Delta pushes: only the elements of the served weights whose bits changed since the version a server holds
(codec.py: encode/apply, exact), in one file (wire.py), chained by digest (chain.py) so that a server refuses a
delta for a base it does not hold. The trainer's side is sync/delta_push.py, the server's in_vllm/delta_base.py."""
