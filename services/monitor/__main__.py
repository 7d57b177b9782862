"""``python -m services.monitor``: run the monitor until SIGTERM."""

from switchyard.runtime.service import main_for

from services.monitor.service import MonitorService

if __name__ == "__main__":
    main_for(MonitorService, name="monitor")
