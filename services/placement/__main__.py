"""``python -m services.placement``: run the placement service until SIGTERM."""

from switchyard.runtime.service import main_for

from services.placement import create

if __name__ == "__main__":
    main_for(create, name="placement")
