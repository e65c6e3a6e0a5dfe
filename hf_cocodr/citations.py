"""The papers hf_cocodr implements, as BibTeX: one leaf module that the model card, the MTEB metadata and the classes
(their ``citation``) read, so none of them imports another for it."""

from __future__ import annotations

CITATIONS: dict[str, dict[str, str]] = {
    "cocodr": {
        "title": "COCO-DR: Combating Distribution Shifts in Zero-Shot Dense Retrieval with Contrastive and "
        "Distributionally Robust Learning",
        "bibtex": """@inproceedings{yu2022cocodr,
  title = {{COCO-DR}: Combating Distribution Shifts in Zero-Shot Dense Retrieval with Contrastive and Distributionally Robust Learning},
  author = {Yu, Yue and Xiong, Chenyan and Sun, Si and Zhang, Chao and Overwijk, Arnold},
  booktitle = {Proceedings of the 2022 Conference on Empirical Methods in Natural Language Processing},
  year = {2022},
  url = {https://arxiv.org/abs/2210.15212}
}""",
    },
    "condenser": {
        "title": "Condenser: a Pre-training Architecture for Dense Retrieval",
        "bibtex": """@inproceedings{gao2021condenser,
  title = {Condenser: a Pre-training Architecture for Dense Retrieval},
  author = {Gao, Luyu and Callan, Jamie},
  booktitle = {Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing},
  year = {2021},
  url = {https://arxiv.org/abs/2104.08253}
}""",
    },
    "groupdro": {
        "title": "Distributionally Robust Neural Networks for Group Shifts",
        "bibtex": """@inproceedings{sagawa2020groupdro,
  title = {Distributionally Robust Neural Networks for Group Shifts: On the Importance of Regularization for Worst-Case Generalization},
  author = {Sagawa, Shiori and Koh, Pang Wei and Hashimoto, Tatsunori B. and Liang, Percy},
  booktitle = {International Conference on Learning Representations},
  year = {2020},
  url = {https://arxiv.org/abs/1911.08731}
}""",
    },
}
