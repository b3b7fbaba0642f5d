"""Size limits Django applies to request bodies while it reads them (behind web/body_limit.py,
which refuses an oversized body before Django reads any of it under ASGI).

A program file is refused as soon as its bytes pass ``SYMPHONY_MAX_PROGRAM_BYTES``, while the
multipart body is parsed, instead of being stored whole and measured by the view afterwards;
a multipart body whose declared length is over ``SYMPHONY_MAX_REQUEST_BYTES`` is refused before
parsing starts. Both answer 413 ``too_large`` in the API's error envelope.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.core.files.uploadhandler import FileUploadHandler
from rest_framework import status
from rest_framework.exceptions import APIException


class TooLarge(APIException, RequestDataTooBig):
    """413 ``too_large``: a request body or an uploaded file is over its limit. Also Django's
    RequestDataTooBig, so a form parsed outside DRF (the admin's) answers a 400, never a 500."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"
    default_detail = "request body is too large"


def body_too_large(limit: int) -> TooLarge:
    return TooLarge(f"request body is over the limit of {limit} bytes (SYMPHONY_MAX_REQUEST_BYTES)")


class BoundedUploadHandler(FileUploadHandler):
    """First of ``FILE_UPLOAD_HANDLERS``: checks sizes and passes every chunk on unchanged to
    the handler that stores it (memory or a temporary file)."""

    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None):
        if content_length > settings.SYMPHONY_MAX_REQUEST_BYTES:
            raise body_too_large(settings.SYMPHONY_MAX_REQUEST_BYTES)
        return None  # go on parsing

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        limit = settings.SYMPHONY_MAX_PROGRAM_BYTES
        if start + len(raw_data) > limit:
            raise TooLarge(f"file {self.file_name!r} is over the limit of {limit} bytes (SYMPHONY_MAX_PROGRAM_BYTES)")
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None  # the next handler returns the stored file
