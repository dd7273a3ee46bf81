"""hearthgate: a scheduling gateway in front of vLLM for a home GPU box.

The installed package keeps everything under one name: ``hearthgate.gateway`` (the server),
``hearthgate.policies`` (pure scheduling policies), ``hearthgate.loadtests`` (the load tester,
``pip install 'hearthgate[bench]'``) and ``hearthgate.deploy`` (worker launchers used by the
tests and the demo). In the source tree these are the top-level folders of the same names,
linked here.
"""
