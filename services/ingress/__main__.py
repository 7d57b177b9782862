"""``python -m services.ingress``: run the ingress as its own process."""

from switchyard.runtime.service import main_for

from services.ingress.service import IngressService

main_for(IngressService, name="ingress")
