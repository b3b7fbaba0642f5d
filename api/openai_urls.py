"""OpenAI-compatible routes, mounted at ``/v1/`` by web/urls.py. Every other ``/v1/`` path is
answered in OpenAI's error envelope (the last route), whatever DEBUG says."""

from django.urls import path, re_path

from api.views import openai, responses

urlpatterns = [
    path("chat/completions", openai.chat_completions, name="openai-chat-completions"),
    path("completions", openai.completions, name="openai-completions"),
    path("models", openai.models, name="openai-models"),
    path("models/<path:model_id>", openai.model, name="openai-model"),
    path("responses", responses.create, name="openai-responses"),
    path("responses/<str:response_id>", responses.detail, name="openai-response"),
    path("responses/<str:response_id>/cancel", responses.cancel, name="openai-response-cancel"),
    path("responses/<str:response_id>/input_items", responses.input_items, name="openai-response-input-items"),
    path("embeddings", openai.unsupported, {"what": "embeddings"}, name="openai-embeddings"),
    re_path(r"^(?P<rest>.*)$", openai.not_found, name="openai-not-found"),
]
