"""Helpers shared by the test modules: servers, ports, processes, certificates, results.

Test modules import from here and never from one another; nothing here is collected by pytest
(no module is named `test_*`).
"""
