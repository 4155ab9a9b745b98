"""The model's load: its `parameters` read and checked (`settings`) and the backend built from
them (`assembly`, the composition root). It sits above the generators it assembles; what each
generator can produce and use is `rtvideo/backend/catalog.py`, below them both."""
