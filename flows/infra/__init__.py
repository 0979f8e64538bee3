"""What the flows stand on, none of it a flow: DVC and git commands and the stage plan (`dvc_stages`), the
trainings' checkouts (`checkouts`), the DVC remote for remote workers (`remote`), the params writer
(`params_file`), the Prefect work pools (`work_pools`), local servers (`net`), and the one-machine stack of
PostgreSQL, Prefect and MLflow servers and workers (`stack`). Nothing here defines a flow or a task.
"""
