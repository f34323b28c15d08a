"""One installer per card kind: ``why_not(entry, inst)`` says why a card of the kind is not
served in the installation's mode (None where it may be), and ``install(inst, entries)`` serves
the kind's cards in the model. ``apply`` dispatches to them through one table, ``KINDS``; no kind
imports another."""
