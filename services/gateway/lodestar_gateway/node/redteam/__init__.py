"""`lodestar redteam`'s library: adversarial agents (agents/, one program per hack kind), their catalogue
(hacks.py: kinds, the verifier kinds each applies to, the defence) and the verdict rules (outcome.py). The
command and the stack it runs on are lodestar_app/cli/redteam.py; docs/redteam.md describes all of it.
"""
