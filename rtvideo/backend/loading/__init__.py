"""The model's load: its `parameters` read and checked (`settings`), what each generator can
produce and use (`catalog`), and the backend built from them (`assembly`, the composition root)."""
