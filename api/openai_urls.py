"""OpenAI-compatible routes, mounted at ``/v1/`` by web/urls.py. Every other ``/v1/`` path is
answered in OpenAI's error envelope (the last route), whatever DEBUG says."""

from django.urls import path, re_path

from api import openai_views, responses_views

urlpatterns = [
    path("chat/completions", openai_views.chat_completions, name="openai-chat-completions"),
    path("completions", openai_views.completions, name="openai-completions"),
    path("models", openai_views.models, name="openai-models"),
    path("models/<path:model_id>", openai_views.model, name="openai-model"),
    path("responses", responses_views.create, name="openai-responses"),
    path("responses/<str:response_id>", responses_views.detail, name="openai-response"),
    path("responses/<str:response_id>/cancel", responses_views.cancel, name="openai-response-cancel"),
    path("responses/<str:response_id>/input_items", responses_views.input_items, name="openai-response-input-items"),
    path("embeddings", openai_views.unsupported, {"what": "embeddings"}, name="openai-embeddings"),
    re_path(r"^(?P<rest>.*)$", openai_views.not_found, name="openai-not-found"),
]
