"""The served models, looked up by any of their names (served name, model id or alias)."""

from __future__ import annotations

from collections.abc import Sequence

from openengine_adapters.backend import ModelCard
from openengine_adapters.errors import invalid, model_not_found


class ModelCatalog:
    def __init__(self, cards: Sequence[ModelCard]) -> None:
        if not cards:
            raise ValueError("a backend must serve at least one model")
        self.cards = tuple(cards)
        self.default = self.cards[0]
        self._by_name: dict[str, ModelCard] = {}
        for card in self.cards:
            for name in (*card.names, card.model_id):
                self._by_name.setdefault(name, card)

    @property
    def supported_models(self) -> list[str]:
        return [card.names[0] for card in self.cards]

    def resolve(self, name: str, *, field: str = "model", required: bool = False) -> ModelCard:
        """The card for ``name``; empty selects the default unless the field is required."""
        if not name:
            if required:
                raise invalid(f"{field}: required and must be non-empty")
            return self.default
        card = self._by_name.get(name)
        if card is None:
            raise model_not_found(name)
        return card
