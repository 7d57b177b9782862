"""``python -m services.worker``: one worker process (builds its backend at start)."""

from switchyard.runtime.service import main_for

from services.worker.service import WorkerService

main_for(WorkerService, name="worker")
