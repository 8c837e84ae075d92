"""Floor 4, report: the fleet report, rendered on the controller.

The analysis of each host's plan and facts, the text report, the HTML page's
model, the store that keeps each host's last result across runs, and verify's
results in the report. Reads what the other floors produced; talks to no node
and no server. May import core, hardware, node and planning; never cluster.
"""
