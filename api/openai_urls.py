"""OpenAI-compatible routes, mounted at ``/v1/`` by web/urls.py."""

from django.urls import path

from api import openai_views

urlpatterns = [
    path("chat/completions", openai_views.chat_completions, name="openai-chat-completions"),
    path("completions", openai_views.completions, name="openai-completions"),
    path("models", openai_views.models, name="openai-models"),
]
