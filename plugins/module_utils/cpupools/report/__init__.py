"""Floor 4, report: the fleet report, rendered on the controller.

The analysis of each host's plan and facts (analysis), the text report (text),
the HTML page's model and the JSON beside it (page), the store that keeps each
host's last result across runs (report_store), verify's results in the report
(report_verify), and what the module calls (report). Reads what the other
floors produced; talks to no node and no server. May import core, hardware,
node and planning; never cluster.
"""
