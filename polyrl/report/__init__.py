"""`polyrl report`: one self-contained HTML page for a training run or an evaluation.

    build.py      which kind of directory, and writing the page (write_report)
    run_data.py   reading a run directory: metrics, held-out scores, flags, obs.sqlite
    eval_data.py  reading an evaluation directory: results.json and tasks.jsonl
    plots.py      matplotlib figures as inline SVG
    html.py       the page: style sheet, tables, drill-downs (no script, no network)
    run_page.py   the sections of a run's page
    eval_page.py  the sections of an evaluation's page
"""
