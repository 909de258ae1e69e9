"""Adapters for agent frameworks (optional extras, imported only when used):

- :mod:`tollgate.adapters.langgraph` (``pip install tollgate[langgraph]``): LangChain
  tools / LangGraph tool nodes whose calls wait on a Tollgate card;
- :mod:`tollgate.adapters.openai_agents` (``pip install tollgate[openai-agents]``):
  OpenAI Agents SDK function tools gated the same way.
"""
