from django.apps import AppConfig


class RetrievalConfig(AppConfig):
    name = "apps.retrieval"
    label = "retrieval"
    verbose_name = "Retrieval: embeddings, vector indexes and background indexing"

    def ready(self) -> None:
        from apps.core import readiness
        from apps.retrieval.embeddings import get_provider

        readiness.register("embedder", lambda: get_provider().check())
