"""One model request, for every endpoint (layer 6): prepare -> send -> answer -> record.
"""
