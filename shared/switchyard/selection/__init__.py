"""Model selection and window scheduling for classification applications (SneakPeek).

``snapshot`` holds what a scheduler sees, ``base`` the Protocol, the plan and the shared
arithmetic; each scheduler family has its own module, and ``registry`` names them.
"""
