"""The endpoints (layer 7): each module has ``install(app, state)`` and runs the pipeline.
"""
