"""Drafting from the target itself (notebook 12): Medusa heads, the EAGLE drafter, EAGLE-2's dynamic tree.

- :mod:`~specdec.drafters.medusa`: K heads on the target's last hidden state, a Cartesian tree of their top-k;
- :mod:`~specdec.drafters.eagle`: one decoder layer that drafts the target's next feature from (feature, next token);
- :mod:`~specdec.drafters.dynamic_tree`: EAGLE-2's tree, expanded by path value under a node budget;
- :mod:`~specdec.drafters.memory`: what each kind of drafter costs in weights and KV;
- :mod:`~specdec.drafters.generate`: the speculative loops for each, verified by the target in one forward;
- :mod:`~specdec.drafters.train`: self-distillation of the heads and the drafter on the target's own text.
"""
