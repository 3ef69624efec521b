"""Everything of EAGLE speculative decoding (docs/architecture.md draws one step).

- `io`: the phases' typed inputs and outputs, and the static shapes they declare
- `phases`: draft, verify, accept (with the KV commit), draft_extend, and the fused step
- `worker`: the host side that chains them (prefill, launch, collect)
- `tree`, `frontier`, `frontier_kernel`: the EAGLE-2 dynamic draft tree
- `verify`: greedy verification and tree rejection sampling
- `token_map`, `token_map_builder`, `corpus`: FR-Spec hot vocabularies
- `stats`: acceptance and phase statistics
"""
