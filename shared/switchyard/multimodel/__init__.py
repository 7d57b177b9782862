"""Multi-model collaborative scheduling under heterogeneity: models with resource
vectors, pipelines of model stages, heterogeneous workers, placement and routing.

``model`` holds the catalogue types, ``snapshot`` what a policy sees and decides; the
policies, workloads and the simulator have their own modules.
"""
