"""The HTTP side of one execute call, in the order a call meets it:

* `edge.py`: the ASGI edge (calls in flight per process and per credential, the body read
  within its limits, the refusals that need no view), which hands the view an `EdgeContext`
  (`context.py`);
* `burst.py`: one credential's gate and the refusals that hold (contract §2.8);
* `reading.py`: the call's headers and body checked against the protocol, once;
* `view.py`: the execute view, which calls `admission.services.call_execute` and answers;
* `body.py`: the ASGI plumbing of bodies and answers, for every route.
"""
