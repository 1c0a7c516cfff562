"""The adversarial agent programs of `lodestar redteam`: one file per hack (`hack_<name>.py`), each run as a
script by the `command` harness inside a real session, standard library only; `_common.py` holds what they
share. Nothing here is imported by the node; the catalogue (which verifier kinds each applies to, its defence)
is `services/gateway/lodestar_gateway/node/redteam/hacks.py`.
"""
