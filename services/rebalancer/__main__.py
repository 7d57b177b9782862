"""``python -m services.rebalancer``: run the rebalancer until SIGTERM."""

from switchyard.runtime.service import main_for

from services.rebalancer.service import RebalancerService

if __name__ == "__main__":
    main_for(RebalancerService, name="rebalancer")
